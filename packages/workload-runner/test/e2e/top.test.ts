// `airm top` as a user runs it, against a real `airm up` (tcp transport: a KV relay too) serving a
// steady load: `--once --json` checked against the parts' own /metrics read just before and just
// after it, and the console in a real terminal (tmux): the parts' rows, counters that move,
// sorting, a filter, a part's log lines, and draining a worker from the console (it refuses new
// work, the cluster keeps serving), then resuming it and quitting.
import { execFile } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { INTERNAL_TOKEN_HEADER } from "@airm/rm-core";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { freePort } from "../../src/index.ts";
import type { Snapshot } from "../../src/top/snapshot.ts";
import { readUpStates, type UpState } from "../../src/top/up-state.ts";
import { type AirmUp, startAirmUp, waitFor } from "../helpers/airm-up.ts";
import { tinyModel, until } from "../helpers/cluster.ts";
import { Tmux } from "../helpers/tmux.ts";

const airm = fileURLToPath(new URL("../../bin/airm.mjs", import.meta.url));
const run = promisify(execFile);

let dir: string;
let runDir: string;
let up: AirmUp;
let state: UpState;
let load: Load;

/** Clients that send completions one after another until stopped; every answer's status is kept. */
interface Load {
  statuses: { at: number; status: number }[];
  stop(): Promise<void>;
}

function startLoad(url: string, model: string, clients: number): Load {
  let stopped = false;
  const statuses: Load["statuses"] = [];
  const end = Date.now() + 170_000; // bounded whatever happens
  const body = JSON.stringify({ model, prompt: "The parts of a cluster, one by one:", max_tokens: 48, ignore_eos: true, temperature: 0 });
  const client = async () => {
    while (!stopped && Date.now() < end) {
      const r = await fetch(`${url}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" }, body }).catch(() => null);
      statuses.push({ at: Date.now(), status: r?.status ?? 0 });
      await r?.text().catch(() => "");
    }
  };
  const running = Promise.all(Array.from({ length: clients }, client));
  return {
    statuses,
    async stop() {
      stopped = true;
      await running;
    },
  };
}

/** A part's /metrics as name{labels} -> value (a reader of the test's own, independent of airm top's). */
async function metricsOf(url: string): Promise<Map<string, number>> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const out = new Map<string, number>();
  for (const m of text.matchAll(/^([a-zA-Z_:][\w:]*(?:\{[^}]*\})?) (\S+)$/gm)) out.set(m[1], Number(m[2]));
  return out;
}

/** The sum of every series of `name` whose label text contains `having`. */
const total = (m: Map<string, number>, name: string, having = "") =>
  [...m].filter(([k]) => (k === name || k.startsWith(`${name}{`)) && k.includes(having)).reduce((a, [, v]) => a + v, 0);

/** The bucket (lower, upper bound] that holds the q-quantile's rank of a cumulative histogram. */
function bucketOf(m: Map<string, number>, name: string, q: number): [number, number] {
  const buckets = [...m]
    .filter(([k]) => k.startsWith(`${name}_bucket{`))
    .map(([k, v]) => [k.includes('le="+Inf"') ? Number.POSITIVE_INFINITY : Number(/le="([^"]+)"/.exec(k)![1]), v] as [number, number])
    .sort((a, b) => a[0] - b[0]);
  const rank = q * buckets.at(-1)![1];
  const i = buckets.findIndex(([, n]) => n >= rank);
  return [i === 0 ? 0 : buckets[i - 1][0], buckets[i][0]];
}

/** The rows of the table on a captured screen: [name, role, state, run, ...] per part. */
function tableRows(screen: string): string[][] {
  const lines = screen.split("\n");
  const head = lines.findIndex((l) => l.startsWith(" PART"));
  const rows: string[][] = [];
  for (const l of lines.slice(head + 1)) {
    if (!/^[ >]\S/.test(l)) break;
    rows.push(l.slice(1).trim().split(/\s+/));
  }
  return rows;
}

/** The count of 200s on the screen's "requests" line. */
const okCount = (screen: string) => Number(/requests .*?200:(\d+)/.exec(screen)?.[1] ?? Number.NaN);

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), "airm-top-e2e-"));
  runDir = mkdtempSync(join(dir, "run-")); // 0700: airm up's state folder goes under it ($XDG_RUNTIME_DIR)
  const model = tinyModel();
  const ports = await Promise.all([0, 1, 2, 3].map(() => freePort()));
  up = startAirmUp(
    [
      "--model",
      model,
      "--port",
      String(ports[0]),
      "--prefill-port",
      String(ports[1]),
      "--decode-port",
      String(ports[2]),
      "--sidecar-port",
      String(ports[3]),
      "--kv-transport",
      "tcp",
      "--quiet",
    ],
    { XDG_RUNTIME_DIR: runDir, AIRM_LOG_LEVEL: "info" },
  );
  await waitFor(() => up.out().includes("rngd-pd is up") || up.child.exitCode !== null, 170_000, "airm up to be ready");
  if (up.child.exitCode !== null) throw new Error(`airm up exited:\n${up.err()}`);
  state = readUpStates(join(runDir, "airm"))[0].state;
  const id = ((await (await fetch(`${state.gateway}/v1/models`)).json()) as { data: { id: string }[] }).data[0].id;
  load = startLoad(state.gateway, id, 3);
  await waitFor(() => load.statuses.filter((s) => s.status === 200).length >= 5, 60_000, "the load to be served");
}, 240_000);

afterAll(async () => {
  await load?.stop();
  up?.kill();
  rmSync(dir, { recursive: true, force: true });
});

const url = (name: string) => {
  const p = state.parts.find((x) => x.name === name)!;
  return p.role === "sidecar" ? p.metrics!.replace(/\/metrics$/, "") : p.url;
};

describe("airm top against airm up under load", () => {
  test("--once --json: one snapshot, its figures within what the parts' own /metrics said just before and after it", async () => {
    const names = ["gateway", "prefill", "decode", "decode-2", "kv-relay"];
    const before = new Map(await Promise.all(names.map(async (n) => [n, await metricsOf(url(n))] as const)));
    const t0 = Date.now();
    const out = await run(process.execPath, [airm, "top", "--once", "--json", "--interval", "2000"], { env: { ...process.env, XDG_RUNTIME_DIR: runDir } });
    const span = (Date.now() - t0) / 1000;
    const after = new Map(await Promise.all(names.map(async (n) => [n, await metricsOf(url(n))] as const)));
    const snap = JSON.parse(out.stdout) as Snapshot;
    const part = (n: string) => snap.parts.find((p) => p.name === n)!;
    expect(snap.parts.map((p) => p.name).sort()).toEqual([...names].sort());
    expect(snap.unreachable).toEqual([]);
    for (const n of names) expect(part(n).state, n).toBe("ok");
    expect(snap.intervalS).toBeGreaterThanOrEqual(2);
    // counters: between the page before and the page after
    const between = (x: number, name: string, of: string, having = "") => {
      expect(x, name).toBeGreaterThanOrEqual(total(before.get(of)!, name, having));
      expect(x, name).toBeLessThanOrEqual(total(after.get(of)!, name, having));
    };
    between(snap.cluster.requests["200"], "airm_gateway_requests_total", "gateway", 'status="200"');
    between(snap.cluster.migrations, "airm_migrations_total", "gateway");
    between(snap.cluster.preemptions, "vllm:num_preemptions_total", "decode");
    // rates: at most what was gained over the whole span of the command, per second of the interval
    const gained = (of: string, name: string) => total(after.get(of)!, name) - total(before.get(of)!, name);
    expect(snap.cluster.requestsPerS).toBeGreaterThan(0);
    expect(snap.cluster.requestsPerS!).toBeLessThanOrEqual(gained("gateway", "airm_gateway_requests_total") / snap.intervalS!);
    const tokens = ["prefill", "decode", "decode-2"].reduce((a, of) => a + gained(of, "vllm:generation_tokens_total"), 0);
    expect(snap.cluster.outputTokPerS).toBeGreaterThan(0);
    expect(snap.cluster.outputTokPerS!).toBeLessThanOrEqual(tokens / snap.intervalS!);
    for (const [n, name, rate] of [
      ["decode", "airm_kv_pulled_bytes_total", part("decode").kvInBytesPerS],
      ["kv-relay", "airm_kv_relay_received_bytes_total", part("kv-relay").kvInBytesPerS],
      ["kv-relay", "airm_kv_relay_sent_bytes_total", part("kv-relay").kvOutBytesPerS],
    ] as const) {
      expect(rate, `${n} ${name}`).toBeGreaterThanOrEqual(0);
      expect(rate!, `${n} ${name}`).toBeLessThanOrEqual(gained(n, name) / snap.intervalS!);
    }
    // latencies since start: inside the buckets that held the ranks before and after
    for (const [q, value] of [
      [0.5, snap.cluster.ttftS.p50],
      [0.9, snap.cluster.ttftS.p90],
    ] as const) {
      const [lo1, hi1] = bucketOf(before.get("gateway")!, "airm_ttft_seconds", q);
      const [lo2, hi2] = bucketOf(after.get("gateway")!, "airm_ttft_seconds", q);
      expect(value).toBeGreaterThanOrEqual(Math.min(lo1, lo2));
      expect(value).toBeLessThanOrEqual(Math.max(hi1, hi2));
    }
    // /health figures: the KV pool as the worker reports it
    const h = (await (await fetch(`${url("decode-2")}/health`)).json()) as { kvCache: { totalBlocks: number }; engine: string; backend: string };
    expect(part("decode-2")).toMatchObject({ kvTotalBlocks: h.kvCache.totalBlocks, engine: h.engine, backend: h.backend, transport: "tcp", role: "decode" });
    expect(span).toBeGreaterThanOrEqual(2);
  });

  test("the console in a terminal: rows, moving counters, sort, filter, logs, and a drain that the cluster serves through", async () => {
    const tmux = new Tmux();
    try {
      tmux.start([process.execPath, airm, "top"], { width: 80, height: 24, env: { XDG_RUNTIME_DIR: runDir }, unset: ["CI"] });
      const first = await tmux.waitFor((s) => tableRows(s).length === 5 && tableRows(s).every((r) => r[2] === "ok") && okCount(s) > 0, 30_000, "five parts, all ok");
      expect(tableRows(first).map((r) => r[0])).toEqual(["gateway", "prefill", "decode", "decode-2", "kv-relay"]);
      expect(first.split("\n").every((l) => l.length <= 80)).toBe(true);
      // counters move
      await tmux.waitFor((s) => okCount(s) > okCount(first), 15_000, "the 200s to grow");

      // s: by role (A to Z), then on to running requests (largest first)
      tmux.keys("s");
      const byRole = await tmux.waitFor((s) => s.includes("sort role"), 5000, "sort by role");
      expect(tableRows(byRole).map((r) => r[1])).toEqual(["decode", "decode", "gateway", "prefill", "relay"]);
      tmux.keys("s", "s");
      const byRun = await tmux.waitFor((s) => s.includes("sort running"), 5000, "sort by running");
      const runs = tableRows(byRun).map((r) => (r[3] === "-" ? -1 : Number(r[3])));
      expect(runs).toEqual([...runs].sort((a, b) => b - a));

      // a filter, then the part's log lines
      tmux.keys("/", "decode-2", "Enter");
      await tmux.waitFor((s) => tableRows(s).length === 1 && tableRows(s)[0][0] === "decode-2", 5000, "the filter");
      tmux.keys("l");
      // The view opens at once and fills when the part's log file is read: wait for its lines.
      const fileLines = () =>
        readFileSync(state.parts.find((p) => p.name === "decode-2")!.log, "utf8")
          .split("\n")
          .filter(Boolean);
      const logView = await tmux.waitFor((s) => s.includes("logs of decode-2") && fileLines().some((l) => s.includes(l.slice(0, 60))), 5000, "the log view with the part's lines");
      expect(fileLines().some((l) => logView.includes(l.slice(0, 60)))).toBe(true);
      tmux.keys("Escape");
      await tmux.waitFor((s) => s.includes(" PART"), 5000, "the table again");

      // drain decode-2 from the console: d, then y
      tmux.keys("d");
      await tmux.waitFor((s) => s.includes("drain decode-2?"), 5000, "the confirmation");
      tmux.keys("y");
      const drained = await tmux.waitFor((s) => s.includes("decode-2 drains"), 10_000, "the drain");
      const drainedAt = Date.now();
      expect(drained).toContain("decode-2 drains");
      await tmux.waitFor((s) => tableRows(s)[0]?.[2] === "draining", 10_000, "decode-2 shown draining");
      // it refuses new work ...
      const health = await fetch(`${url("decode-2")}/health`);
      expect([health.status, ((await health.json()) as { status: string }).status]).toEqual([503, "draining"]);
      const refused = await fetch(`${url("decode-2")}/internal/decode`, {
        method: "POST",
        headers: { "content-type": "application/json", [INTERNAL_TOKEN_HEADER]: state.internalToken },
        body: JSON.stringify({ requestId: "cmpl-0123456789abcdef0123top1", maxTokens: 4, sampling: { temperature: 0 } }),
      });
      expect(refused.status).toBe(503);
      expect(((await refused.json()) as { error: { code: string } }).error.code).toBe("worker_draining");
      // ... and the cluster keeps serving: decode takes it all, every answer after the drain is a 200
      await until(
        async () => ((await (await fetch(`${url("decode-2")}/health`)).json()) as { requests: { running: number } }).requests.running === 0,
        "decode-2's last requests to end",
        30_000,
        200,
      );
      const servedBefore = total(await metricsOf(url("decode-2")), "airm_worker_requests_total", 'outcome="ok"');
      const okBefore = load.statuses.filter((s) => s.status === 200).length;
      await waitFor(() => load.statuses.filter((s) => s.status === 200).length >= okBefore + 10, 60_000, "ten more answers");
      expect(load.statuses.filter((s) => s.at > drainedAt && s.status !== 200)).toEqual([]);
      expect(total(await metricsOf(url("decode-2")), "airm_worker_requests_total", 'outcome="ok"')).toBe(servedBefore);

      // u resumes it; q quits
      tmux.keys("u");
      await tmux.waitFor((s) => s.includes("decode-2 takes requests again"), 10_000, "the resume");
      expect((await fetch(`${url("decode-2")}/health`)).status).toBe(200);
      tmux.keys("Escape", "q");
      await tmux.waitFor(() => !tmux.running(), 10_000, "airm top to quit");
    } finally {
      tmux.kill();
    }
  });

  test("without a terminal airm top prints nothing but with --once", async () => {
    const r = await run(process.execPath, [airm, "top"], { env: { ...process.env, XDG_RUNTIME_DIR: runDir } }).catch((e: { code: number; stdout: string; stderr: string }) => e);
    expect([r.stdout, (r as { code?: number }).code]).toEqual(["", 2]);
    expect(r.stderr).toContain("--once");
  });
});
