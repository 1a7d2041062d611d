// Where a decode step of the CPU model spends its time: per-component CPU time of one step of the
// 135m preset at B=1 and B=4, steps interleaved (kernels timed by wrapping the runtime's entry
// points, which adds a little to each call; "js+overhead" is the rest of the step). CPU time of
// the process (process.cpuUsage), not wall time, so other processes' load matters less. The
// final JSON line holds the step medians and the matmul share. Usage:
// pnpm bench llama-decode-profile [--model DIR] [--steps N] [--raw]   (--raw: step totals only)
import { execFileSync } from "node:child_process";
import { existsSync, renameSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { LlamaModel } from "../packages/llama/src/model/llama-model.ts";
import { loadCheckpoint } from "../packages/llama/src/checkpoint/load-checkpoint.ts";
import { flagOf, int, switchOf, text } from "../packages/rm-core/src/index.ts";
import { benchArgs, finalLine } from "./lib.ts";

const args = benchArgs("llama-decode-profile", "where one decode step's time goes, kernel by kernel", {
  model: flagOf(text({ label: "path" }), { defaultText: "the generated 135m preset", doc: "model folder" }),
  steps: flagOf(int({ min: 1 }), { default: 24, doc: "decode steps profiled" }),
  raw: switchOf({ doc: "step totals only, no per-kernel wrappers" }),
});
// --model is used as it is (a folder or a .gguf file); only the default preset folder is made here.
const dir = args.model ?? join(tmpdir(), "airm-bench-135m-preset");
if (args.model === undefined && !existsSync(join(dir, "model.safetensors"))) {
  // the same preset model bench/llama-decode.ts makes
  const cli = fileURLToPath(new URL("../packages/llama/bin/airm-model.mjs", import.meta.url));
  const partial = `${dir}.partial-${process.pid}`;
  execFileSync(process.execPath, [cli, "make-tiny", "--arch", "llama", "--preset", "135m", "--out", partial], { stdio: "pipe" });
  rmSync(dir, { recursive: true, force: true });
  renameSync(partial, dir);
}
const steps = args.steps;
const model = await LlamaModel.load(await loadCheckpoint(dir), { threads: 1 });
const c = model.config;
const rt = model.rt as unknown as Record<string, (...a: number[]) => unknown>;
const acc = new Map<string, number>();
const cpuMs = (): number => {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1000;
};
let on = false;
const names: Record<string, string> = {
  [`${(c.numHeads + 2 * c.numKvHeads) * c.headDim}x${c.hiddenSize}`]: "matmul qkv",
  [`${c.hiddenSize}x${c.numHeads * c.headDim}`]: "matmul o_proj",
  [`${2 * c.intermediateSize}x${c.hiddenSize}`]: "matmul gate_up",
  [`${c.hiddenSize}x${c.intermediateSize}`]: "matmul down",
  [`${c.vocabSize}x${c.hiddenSize}`]: "matmul lm_head",
};
const raw = args.raw; // step totals only, no per-kernel wrappers
for (const k of raw ? [] : Object.getOwnPropertyNames(Object.getPrototypeOf(rt))) {
  const f = rt[k];
  // the public entry points only (`run` is the matmuls' private dispatcher)
  if (typeof f !== "function" || ["constructor", "alloc", "free", "close", "run", "startWorker", "refreshViews"].includes(k)) continue;
  rt[k] = function (this: unknown, ...a: number[]) {
    if (!on) return f.apply(rt, a);
    const t0 = cpuMs();
    const r = f.apply(rt, a);
    const dt = cpuMs() - t0;
    // matmul(w, x, y, T, cols, rows) and matmulQ(kind, w, x, y, T, cols, rows, r0, r1): by shape
    const [rows, cols] = k === "matmul" ? [a[5], a[4]] : [a[6], a[5]];
    const name = k === "matmul" || k === "matmulQ" ? (names[`${rows}x${cols}`] ?? `matmul ${rows}x${cols}`) : k;
    acc.set(name, (acc.get(name) ?? 0) + dt);
    return r;
  };
}
const S = 512;
const prompt = Array.from({ length: 64 }, (_, i) => (i * 7919 + 13) % c.vocabSize);
const Bs = [1, 4];
const cachesByB = Bs.map((B) =>
  Array.from({ length: B }, (_, i) => {
    const cache = model.newCache(S);
    model.prefill(prompt.slice(i, i + 16), cache);
    return cache;
  }),
);
const totals: number[][] = Bs.map(() => []);
const per: Map<string, number>[][] = Bs.map(() => []);
for (let s = 0; s < steps; s++) {
  for (let b = 0; b < Bs.length; b++) {
    acc.clear();
    on = true;
    const t0 = cpuMs();
    model.decode(cachesByB[b].map((cache, i) => ({ cache, token: (s * 31 + i) % c.vocabSize })));
    totals[b].push(cpuMs() - t0);
    on = false;
    per[b].push(new Map(acc));
  }
}
const summary: Record<string, unknown> = { bench: "llama-decode-profile", steps };
const median = (xs: number[]): number => [...xs].sort((a, b) => a - b)[xs.length >> 1];
for (let b = 0; b < Bs.length; b++) {
  const keys = new Set(per[b].flatMap((m) => [...m.keys()]));
  const rows = [...keys].map((k) => [k, median(per[b].map((m) => m.get(k) ?? 0))] as [string, number]);
  const tm = median(totals[b]);
  const kern = rows.reduce((a, r) => a + r[1], 0);
  console.log(`B=${Bs[b]}: median step ${tm.toFixed(2)} ms CPU, fastest ${Math.min(...totals[b]).toFixed(2)} ms (medians per component)`);
  for (const [k, v] of rows.sort((x, y) => y[1] - x[1])) console.log(`  ${k.padEnd(16)} ${v.toFixed(2)} ms`);
  console.log(`  ${"js+overhead".padEnd(16)} ${(tm - kern).toFixed(2)} ms`);
  summary[`b${Bs[b]}_step_cpu_ms`] = tm;
  if (!raw) summary[`b${Bs[b]}_matmul_share`] = rows.filter(([k]) => k.startsWith("matmul")).reduce((a, r) => a + r[1], 0) / tm;
}
model.close();
finalLine(summary);
