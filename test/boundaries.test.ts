// Package boundaries: hosts (worker, gateway, workload-runner) import only the contracts
// (rm-core, internal-api), the routing library (mode names, scoring, the KV block index), the grammar library (structured outputs: the spec the contract
// carries, checked by the gateway and run by the worker) and the telemetry library (each part's
// trace export), and name no engine or transport except
// as a default; no transport imports another (shared parts live in kv-relay); plugins are found
// by name; no package's files import each other in a cycle (type imports count: a cycle of types
// still ties the files' order and meaning together).
import { dirname, join, normalize } from "node:path";
import { describe, expect, test } from "vitest";
import { packageSources, packages } from "./source-files.ts";

const HOSTS = ["worker", "gateway", "workload-runner"];
const TRANSPORTS = ["kv-shm", "kv-tcp", "kv-nixl-ucx", "kv-nixl"];
const PLUGIN_NAMES = ["shm", "tcp", "nixl-ucx", "nixl", "rngd", "rngd-full", "rngd-chunk", "atom"];

/** Where a host may name a plugin: its defaults. */
const DEFAULTS = [
  /export const DEFAULT_KV_TRANSPORT = "shm";/,
  /export const DEFAULT_BACKENDS = \{ prefill: "rngd-full", decode: "atom", solo: "rngd" \} as const;/,
  /export const SWEEP_DEFAULTS = \{ transports: \["shm", "tcp"\], decode: \["atom", "rngd"\], batch: \[4, 8\] \};/,
];

const importsOf = (text: string) =>
  [...text.matchAll(/^\s*(?:import|export)\b[^"']*?from\s+["']([^"']+)["']/gm), ...text.matchAll(/import\(\s*["']([^"']+)["']\s*\)/g)].map((m) => m[1]);

describe("package boundaries", () => {
  test("hosts import no @airm package but the contracts (rm-core, internal-api) and the routing, grammar and telemetry libraries", () => {
    const bad: string[] = [];
    for (const pkg of HOSTS) {
      for (const [file, text] of packageSources(pkg)) {
        for (const spec of importsOf(text)) {
          if (!spec.startsWith("@airm/") || ["@airm/rm-core", "@airm/internal-api", "@airm/grammar", "@airm/telemetry", "@airm/routing"].includes(spec)) continue;
          // The runner picks its default model with the model cache's rules (docs/decisions.md).
          if (file === "packages/workload-runner/src/default-model.ts" && spec === "@airm/llama") continue;
          bad.push(`${file} imports ${spec}`);
        }
      }
    }
    expect(bad).toEqual([]);
  });

  test("hosts name no engine or transport outside their defaults (the registry says what is installed)", () => {
    const bad: string[] = [];
    for (const pkg of HOSTS) {
      for (const [file, text] of packageSources(pkg)) {
        text.split("\n").forEach((line, i) => {
          if (DEFAULTS.some((d) => d.test(line))) return;
          for (const m of line.matchAll(/["'`]([a-z-]+)["'`]/g)) if (PLUGIN_NAMES.includes(m[1])) bad.push(`${file}:${i + 1}: ${line.trim()}`);
          if (/PD_SHM_ROOT|AIRM_KV_TCP_|AIRM_KV_UCX_/.test(line)) bad.push(`${file}:${i + 1}: ${line.trim()}`);
        });
      }
    }
    expect(bad).toEqual([]);
  });

  test("no transport imports another transport", () => {
    const bad: string[] = [];
    for (const pkg of TRANSPORTS) {
      for (const [file, text] of packageSources(pkg)) {
        for (const spec of importsOf(text)) if (TRANSPORTS.some((t) => spec === `@airm/${t}` && t !== pkg)) bad.push(`${file} imports ${spec}`);
      }
    }
    expect(bad).toEqual([]);
  });
});

/**
 * The import cycles among `files` ([path, text]): each a list of files that reach one another
 * through relative imports (strongly connected components of more than one file, or a file that
 * imports itself).
 */
function importCycles(files: [string, string][]): string[][] {
  const known = new Set(files.map(([f]) => f));
  const edges = new Map(
    files.map(([f, text]) => [
      f,
      importsOf(text)
        .filter((s) => s.startsWith("."))
        .map((s) => normalize(join(dirname(f), s)))
        .filter((t) => known.has(t)),
    ]),
  );
  const order = new Map<string, number>();
  const low = new Map<string, number>();
  const stack: string[] = [];
  const cycles: string[][] = [];
  const visit = (v: string): void => {
    order.set(v, order.size);
    low.set(v, order.get(v)!);
    stack.push(v);
    for (const w of edges.get(v)!) {
      if (!order.has(w)) {
        visit(w);
        low.set(v, Math.min(low.get(v)!, low.get(w)!));
      } else if (stack.includes(w)) low.set(v, Math.min(low.get(v)!, order.get(w)!));
    }
    if (low.get(v) !== order.get(v)) return;
    const group = stack.splice(stack.indexOf(v));
    if (group.length > 1 || edges.get(v)!.includes(v)) cycles.push(group.sort());
  };
  for (const f of edges.keys()) if (!order.has(f)) visit(f);
  return cycles;
}

describe("import cycles", () => {
  test("the gateway's orchestrator knows nothing of the OpenAI wire format (it imports nothing from openai/)", () => {
    const bad = packageSources("gateway")
      .filter(([file]) => file.startsWith("packages/gateway/src/orchestrator/"))
      .flatMap(([file, text]) =>
        importsOf(text)
          .filter((spec) => spec.includes("/openai/"))
          .map((spec) => `${file} imports ${spec}`),
      );
    expect(bad).toEqual([]);
  });

  test("no package's source files import one another in a cycle", () => {
    const found = packages().flatMap((pkg) => importCycles(packageSources(pkg)).map((c) => c.join(" -> ")));
    expect(found).toEqual([]);
  });

  test("the check sees a cycle, a longer one, and a file that imports itself", () => {
    const files: [string, string][] = [
      ["p/src/a.ts", 'import { b } from "./b.ts";'],
      ["p/src/b.ts", 'import type { A } from "./a.ts";'],
      ["p/src/c.ts", 'export { d } from "./sub/d.ts";'],
      ["p/src/sub/d.ts", 'const e = await import("../e.ts");'],
      ["p/src/e.ts", 'import { c } from "./c.ts";'],
      ["p/src/f.ts", 'import { f } from "./f.ts";'],
      ["p/src/g.ts", 'import { a } from "./a.ts";'],
    ];
    expect(importCycles(files)).toEqual([["p/src/a.ts", "p/src/b.ts"], ["p/src/c.ts", "p/src/e.ts", "p/src/sub/d.ts"], ["p/src/f.ts"]]);
  });
});
