// pnpm bench kernel-i8 [--rows 3072] [--cols 576]
// A probe, not a product kernel: would 8-bit activations over wasm relaxed-SIMD dot products
// (i32x4.relaxed_dot_i8x16_i7x16_add_s, what llama.cpp's 8-bit activations map to) make the q4
// matmul faster than the shipped kernel with 16-bit activations (i32x4.dot_i16x8_s)? Same Q4_1
// weights, same tile shape (4 rows x 4 tokens, one 32-column block per step, per-block integer
// sums reduced across the 4 rows), timed in one process against the shipped kernel at T = 1, 4,
// 8, 16. Node 20 has relaxed SIMD only behind --experimental-wasm-relaxed-simd: the bench runs
// itself again with the flag when the module does not validate.
import { spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import { createRequire } from "node:module";
import { f16BitsToF32, f32ToBf16 } from "../packages/llama/src/checkpoint/bf16-convert.ts";
import { KernelRuntime } from "../packages/llama/src/kernels/kernel-runtime.ts";
import { wasmApi } from "../packages/llama/src/kernels/wasm-api.ts";
import { packStoredRows, quantImageBytes, quantizeBf16Rows } from "../packages/llama/src/kernels/quant-image.ts";
import { flagOf, int } from "../packages/rm-core/src/index.ts";
import { benchArgs, finalLine, summarize } from "./lib.ts";

const args = benchArgs("kernel-i8", "q4 matmul: 8-bit activations over relaxed-SIMD dots against the shipped 16-bit kernel", {
  rows: flagOf(int({ min: 4 }), { default: 3072, doc: "output rows (a multiple of 4; SmolLM2's gate_up is 3072)" }),
  cols: flagOf(int({ min: 32 }), { default: 576, doc: "columns (a multiple of 32; SmolLM2's hidden size is 576)" }),
});
const ROWS = args.rows,
  COLS = args.cols;
const nb = COLS / 32;
// wabt is @airm/llama's dependency (it assembles kernels.wat), not the workspace root's
const wabtInit = createRequire(new URL("../packages/llama/package.json", import.meta.url))("wabt") as () => Promise<{
  parseWat(name: string, text: string, features: Record<string, boolean>): { toBinary(o: object): { buffer: Uint8Array } };
}>;
const wabt = await wabtInit();
// ---------------- WAT
const R = [0, 1, 2, 3];
function tile(name: string, nt: number): string {
  const T = Array.from({ length: nt }, (_, i) => i);
  const red = (t: number) => `
        (local.set $a (i32x4.add (i8x16.shuffle 0 1 2 3 16 17 18 19 4 5 6 7 20 21 22 23 (local.get $s0) (local.get $s1)) (i8x16.shuffle 8 9 10 11 24 25 26 27 12 13 14 15 28 29 30 31 (local.get $s0) (local.get $s1))))
        (local.set $b (i32x4.add (i8x16.shuffle 0 1 2 3 16 17 18 19 4 5 6 7 20 21 22 23 (local.get $s2) (local.get $s3)) (i8x16.shuffle 8 9 10 11 24 25 26 27 12 13 14 15 28 29 30 31 (local.get $s2) (local.get $s3))))
        (local.set $a (i32x4.add (i8x16.shuffle 0 1 2 3 4 5 6 7 16 17 18 19 20 21 22 23 (local.get $a) (local.get $b)) (i8x16.shuffle 8 9 10 11 12 13 14 15 24 25 26 27 28 29 30 31 (local.get $a) (local.get $b))))
        (v128.store offset=${512 + 16 * t} (local.get $scr) (f32x4.add (f32x4.add (v128.load offset=${512 + 16 * t} (local.get $scr))
            (f32x4.mul (f32x4.convert_i32x4_s (local.get $a)) (f32x4.mul (local.get $dw) (f32x4.splat (f32.load offset=${4 * t} (local.get $sb))))))
            (f32x4.mul (local.get $mw) (f32x4.splat (f32.load offset=${16 + 4 * t} (local.get $sb))))))`;
  return `
  (func $${name} (param $w i32) (param $x i32) (param $xs i32) (param $y i32) (param $nb i32) (param $ys i32) (param $scr i32) (param $groups i32)
    (local $v v128) ${R.map((r) => `(local $l${r} v128) (local $h${r} v128) (local $s${r} v128)`).join(" ")} (local $xl v128) (local $xh v128) (local $a v128) (local $b v128) (local $dw v128) (local $mw v128)
    (local $xb i32) (local $sb i32) (local $end i32) (local $yend i32)
    (local.set $yend (i32.add (local.get $y) (i32.shl (local.get $groups) (i32.const 4))))
    (block $all_done (loop $group
      (br_if $all_done (i32.ge_u (local.get $y) (local.get $yend)))
      ${T.map((t) => `(v128.store offset=${512 + 16 * t} (local.get $scr) (v128.const i32x4 0 0 0 0))`).join("\n      ")}
      (local.set $xb (local.get $x)) (local.set $sb (local.get $xs))
      (local.set $end (i32.add (local.get $w) (i32.mul (local.get $nb) (i32.const 96))))
      (loop $block
        ${R.map((r) => `(local.set $v (v128.load offset=${16 * r} (local.get $w))) (local.set $l${r} (v128.and (local.get $v) (v128.const i8x16 15 15 15 15 15 15 15 15 15 15 15 15 15 15 15 15))) (local.set $h${r} (i8x16.shr_u (local.get $v) (i32.const 4)))`).join("\n        ")}
        (local.set $dw (v128.load offset=64 (local.get $w)))
        (local.set $mw (v128.load offset=80 (local.get $w)))
        ${T.map(
          (t) => `(local.set $xl (v128.load offset=${32 * t} (local.get $xb))) (local.set $xh (v128.load offset=${32 * t + 16} (local.get $xb)))
        ${R.map((r) => `(local.set $s${r} (i32x4.relaxed_dot_i8x16_i7x16_add_s (local.get $xl) (local.get $l${r}) (i32x4.relaxed_dot_i8x16_i7x16_add_s (local.get $xh) (local.get $h${r}) (v128.const i32x4 0 0 0 0))))`).join(" ")}
        ${red(t)}`,
        ).join("\n        ")}
        (local.set $xb (i32.add (local.get $xb) (i32.const ${32 * 4})))
        (local.set $sb (i32.add (local.get $sb) (i32.const 32)))
        (br_if $block (i32.lt_u (local.tee $w (i32.add (local.get $w) (i32.const 96))) (local.get $end))))
      ${T.map((t) => `(v128.store (i32.add (local.get $y) (i32.mul (local.get $ys) (i32.const ${t}))) (v128.load offset=${512 + 16 * t} (local.get $scr)))`).join("\n      ")}
      (local.set $y (i32.add (local.get $y) (i32.const 16)))
      (br $group))))`;
}
const wat = `(module (import "env" "memory" (memory 1 65536 shared))
${tile("t4", 4)}
${tile("t1", 1)}
  (func (export "mm") (param $w i32) (param $x i32) (param $xs i32) (param $y i32) (param $T i32) (param $nb i32) (param $rows i32) (param $scr i32)
    (local $t i32) (local $ys i32)
    (local.set $ys (i32.shl (local.get $rows) (i32.const 2)))
    (block $d (loop $q (br_if $d (i32.gt_u (i32.add (local.get $t) (i32.const 4)) (local.get $T)))
      (call $t4 (local.get $w) (i32.add (local.get $x) (i32.mul (i32.shr_u (local.get $t) (i32.const 2)) (i32.shl (local.get $nb) (i32.const 7)))) (i32.add (local.get $xs) (i32.mul (i32.shr_u (local.get $t) (i32.const 2)) (i32.shl (local.get $nb) (i32.const 5))))
        (i32.add (local.get $y) (i32.mul (local.get $t) (local.get $ys))) (local.get $nb) (local.get $ys) (local.get $scr) (i32.shr_u (local.get $rows) (i32.const 2)))
      (local.set $t (i32.add (local.get $t) (i32.const 4))) (br $q)))
    (block $d1 (loop $s (br_if $d1 (i32.ge_u (local.get $t) (local.get $T)))
      (call $t1 (local.get $w) (i32.add (i32.add (local.get $x) (i32.mul (i32.shr_u (local.get $t) (i32.const 2)) (i32.shl (local.get $nb) (i32.const 7)))) (i32.shl (i32.and (local.get $t) (i32.const 3)) (i32.const 5)))
        (i32.add (i32.add (local.get $xs) (i32.mul (i32.shr_u (local.get $t) (i32.const 2)) (i32.shl (local.get $nb) (i32.const 5)))) (i32.shl (i32.and (local.get $t) (i32.const 3)) (i32.const 2)))
        (i32.add (local.get $y) (i32.mul (local.get $t) (local.get $ys))) (local.get $nb) (local.get $ys) (local.get $scr) (i32.shr_u (local.get $rows) (i32.const 2)))
      (local.set $t (i32.add (local.get $t) (i32.const 1))) (br $s))))
)`;
// The single-token tile reads its token's 32 bytes inside the quad layout (stride 128 per block).
const bin = wabt.parseWat("i8.wat", wat, { simd: true, threads: true, relaxed_simd: true }).toBinary({}).buffer;
const validate = (globalThis as unknown as { WebAssembly: { validate(b: Uint8Array): boolean } }).WebAssembly.validate;
if (!validate(bin)) {
  if (process.execArgv.includes("--experimental-wasm-relaxed-simd")) throw new Error("this V8 does not take wasm relaxed SIMD even with --experimental-wasm-relaxed-simd");
  const r = spawnSync(process.execPath, ["--experimental-wasm-relaxed-simd", ...process.execArgv, fileURLToPath(import.meta.url), ...process.argv.slice(2)], { stdio: "inherit" });
  process.exit(r.status ?? 1);
}
const rt = await KernelRuntime.create({ threads: 1, initialBytes: ROWS * COLS + (64 << 20) });
const mod = await wasmApi.compile(bin);
const inst = await wasmApi.instantiate(mod, { env: { memory: rt.memory } });
const mm = inst.exports.mm as (...a: number[]) => void;

// random bf16 weights -> Q4_1 blocks -> (a) the i16 kernel's image, (b) the i8 prototype's image
let seed = 1;
const rnd = () => ((seed = (seed * 1103515245 + 12345) >>> 0) / 2 ** 32) * 2 - 1;
const f32 = new Float32Array(ROWS * COLS).map(() => rnd() * 0.05);
const bf = Uint16Array.from(f32, f32ToBf16);
const q41 = quantizeBf16Rows("Q4_1", bf, ROWS, COLS);
const img = rt.alloc(quantImageBytes("q4", ROWS, COLS));
packStoredRows("q4", "Q4_1", q41, rt.u8, img, 0, ROWS, COLS, "proto", "w");
const img8 = rt.alloc(ROWS * nb * 24 + 64);
{
  const u8 = rt.u8,
    dv = new DataView(rt.memory.buffer);
  for (let r = 0; r < ROWS; r++)
    for (let b = 0; b < nb; b++) {
      const src = (r * nb + b) * 20;
      const g = img8 + ((r >> 2) * nb + b) * 96;
      const j = r & 3;
      const d = f16BitsToF32(q41[src]! | (q41[src + 1]! << 8)),
        m = f16BitsToF32(q41[src + 2]! | (q41[src + 3]! << 8));
      for (let k = 0; k < 16; k++) u8[g + 16 * j + k] = q41[src + 4 + k]!;
      dv.setFloat32(g + 64 + 4 * j, d, true);
      dv.setFloat32(g + 80 + 4 * j, m, true);
    }
}
const scr = rt.alloc(1024);
const rowsOut: { T: number; i16Ms: number; i8Ms: number; speedup: number; maxDiff: number }[] = [];
for (const T of [1, 4, 8, 16]) {
  const xf = rt.alloc(T * COLS * 4),
    xq = rt.alloc(Math.ceil(T / 4) * COLS * 9 + 64),
    y16 = rt.alloc(T * ROWS * 4),
    y8 = rt.alloc(T * ROWS * 4);
  const x8 = rt.alloc(Math.ceil(T / 4) * nb * 128),
    xs8 = rt.alloc(Math.ceil(T / 4) * nb * 32);
  const X = new Float32Array(T * COLS).map(() => rnd());
  rt.f32.set(X, xf >> 2);
  rt.quantX(xf, xq, T, COLS);
  const dv = new DataView(rt.memory.buffer);
  for (let t = 0; t < T; t++)
    for (let b = 0; b < nb; b++) {
      let amax = 0;
      for (let k = 0; k < 32; k++) amax = Math.max(amax, Math.abs(X[t * COLS + 32 * b + k]!));
      const d = Math.fround(amax / 127);
      let sum = 0;
      for (let k = 0; k < 32; k++) {
        const q = d ? Math.round(X[t * COLS + 32 * b + k]! / d) : 0;
        sum += q;
        rt.u8[x8 + ((t >> 2) * nb + b) * 128 + 32 * (t & 3) + k] = q & 255;
      }
      dv.setFloat32(xs8 + ((t >> 2) * nb + b) * 32 + 4 * (t & 3), d, true);
      dv.setFloat32(xs8 + ((t >> 2) * nb + b) * 32 + 16 + 4 * (t & 3), Math.fround(d * sum), true);
    }
  const time = (f: () => void) => {
    for (let i = 0; i < 20; i++) f();
    const ts: number[] = [];
    for (let i = 0; i < 60; i++) {
      const t0 = performance.now();
      f();
      ts.push(performance.now() - t0);
    }
    return summarize(ts).median;
  };
  const a = time(() => rt.matmulQ("q4", img, xq, y16, T, COLS, ROWS));
  const b = time(() => mm(img8, x8, xs8, y8, T, nb, ROWS, scr));
  let err = 0,
    ref = 0;
  for (let i = 0; i < T * ROWS; i++) {
    err = Math.max(err, Math.abs(rt.f32[(y16 >> 2) + i]! - rt.f32[(y8 >> 2) + i]!));
    ref = Math.max(ref, Math.abs(rt.f32[(y16 >> 2) + i]!));
  }
  rowsOut.push({ T, i16Ms: +a.toFixed(4), i8Ms: +b.toFixed(4), speedup: +(a / b).toFixed(3), maxDiff: +err.toExponential(2) });
  console.log(
    `T=${T} ${ROWS}x${COLS}: i16 ${a.toFixed(3)} ms, i8 relaxed ${b.toFixed(3)} ms, speedup ${(a / b).toFixed(2)}; max |diff| ${err.toExponential(2)} of max |y| ${ref.toFixed(3)}`,
  );
}
rt.close();
finalLine({ bench: "kernel-i8", rows: ROWS, cols: COLS, node: process.version, levels: rowsOut });
