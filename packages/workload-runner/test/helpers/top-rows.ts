// Rows of `airm top` for its unit tests: a cluster of airm up's shape (a gateway, a prefill
// worker, decode workers, a KV relay), one decode worker draining.
import type { PartRow, Snapshot } from "../../src/top/snapshot.ts";
import type { Line } from "../../src/top/view.ts";

export const FOOTER_PLACEHOLDER: Line = [{ text: " keys" }];

const row = (over: Partial<PartRow> & Pick<PartRow, "name" | "kind" | "role">): PartRow => ({
  url: `http://127.0.0.1/${over.name}`,
  engine: null,
  backend: null,
  device: null,
  transport: null,
  state: "ok",
  draining: false,
  circuit: null,
  running: null,
  waiting: null,
  decodeBatch: null,
  kvUsedBlocks: null,
  kvTotalBlocks: null,
  prefixHit: null,
  kvInBytesPerS: null,
  kvOutBytesPerS: null,
  restarts: 0,
  error: null,
  ...over,
});

const worker = (name: string, role: string, running: number, over: Partial<PartRow> = {}) =>
  row({
    name,
    kind: "worker",
    role,
    engine: role === "prefill" ? "rngd" : "atom",
    backend: role === "prefill" ? "rngd-full" : "atom",
    device: "cpu:cpu-reference",
    transport: "tcp",
    circuit: "closed",
    running,
    waiting: 0,
    kvUsedBlocks: 4 * running,
    kvTotalBlocks: 982_971,
    ...over,
  });

/** A gateway, a prefill worker, `decodes` decode workers (decode-2 draining) and a relay. */
export function rowsOf(decodes = 2): PartRow[] {
  const decodeRows = Array.from({ length: decodes }, (_, i) =>
    worker(i === 0 ? "decode" : `decode-${i + 1}`, "decode", (i * 7) % 5, { decodeBatch: 1 + (i % 3), ...(i === 1 ? { state: "draining" as const, draining: true } : {}) }),
  );
  return [
    row({ name: "kv-relay", kind: "relay", role: "relay", kvInBytesPerS: 52_000, kvOutBytesPerS: 48_000 }),
    ...decodeRows,
    worker("prefill", "prefill", 1, { prefixHit: 0.76 }),
    row({ name: "gateway", kind: "gateway", role: "gateway", running: 3 }),
  ];
}

/** A snapshot holding `rows`. */
export function snapshotOf(rows: PartRow[]): Snapshot {
  return {
    at: "2026-01-01T12:00:00.000Z",
    source: "airm up 127.0.0.1:8000 (pid 1)",
    intervalS: 1,
    cluster: {
      windowS: 60,
      ttftS: { p50: 0.12, p90: 0.34, count: 40 },
      tpotS: { p50: 0.021, p90: 0.04, count: 40 },
      outputTokPerS: 53.2,
      requestsPerS: 1.8,
      requests: { "200": 120, "429": 3 },
      rateLimited: 3,
      migrations: 1,
      preemptions: 0,
      running: 5,
      waiting: 0,
    },
    parts: rows,
    unreachable: [],
    notes: [],
  };
}
