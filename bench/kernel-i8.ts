// pnpm bench kernel-i8 [--rows 3072] [--cols 576] [--type Q4_1|Q4_0]
// The Q4 matmul over 8-bit inputs (q4a8: relaxed-SIMD i16 dots on nibbles, four rows in the lanes)
// against the same matmul over 16-bit inputs (q4: i32x4.dot_i16x8_s), the shipped kernels of
// wat/kernels.wat through KernelRuntime, one thread, in one process on the same Q4 blocks, at
// T = 1, 4, 16, 64 tokens; each timing includes quantizing the input (quant_x8 / quant_x). The
// matrix is small enough to stay in cache: this measures the kernels' arithmetic, not memory.
// Prints multiply-adds per second and the largest difference between the two results.
import { f32ToBf16 } from "../packages/llama/src/checkpoint/bf16-convert.ts";
import { KernelRuntime } from "../packages/llama/src/kernels/kernel-runtime.ts";
import { packStoredRows, quantImageBytes, quantizeBf16Rows } from "../packages/llama/src/kernels/quant-image.ts";
import { flagOf, int, oneOf } from "../packages/rm-core/src/index.ts";
import { benchArgs, finalLine, summarize } from "./lib.ts";

const args = benchArgs("kernel-i8", "Q4 matmul over 8-bit inputs (relaxed-SIMD dots) against the 16-bit kernel", {
  rows: flagOf(int({ min: 4 }), { default: 3072, doc: "output rows (a multiple of 4; SmolLM2's gate_up is 3072)" }),
  cols: flagOf(int({ min: 32 }), { default: 576, doc: "columns (a multiple of 32; SmolLM2's hidden size is 576)" }),
  type: flagOf(oneOf(["Q4_1", "Q4_0"] as const), { default: "Q4_1", doc: "block type of the random weights" }),
});
const ROWS = args.rows,
  COLS = args.cols;
if (ROWS % 4 !== 0 || COLS % 32 !== 0) {
  console.error("--rows must be a multiple of 4 and --cols of 32");
  process.exit(2);
}
const rt = await KernelRuntime.create({ threads: 1, initialBytes: ROWS * COLS * 2 + (64 << 20) });
let seed = 1;
const rnd = () => ((seed = (seed * 1103515245 + 12345) >>> 0) / 2 ** 32) * 2 - 1;
const bf = Uint16Array.from(
  new Float32Array(ROWS * COLS).map(() => rnd() * 0.05),
  f32ToBf16,
);
// Q4_0 from Q4_1 blocks: keep d and the nibbles, drop m (the kernels' arithmetic is what is timed)
const q41 = quantizeBf16Rows("Q4_1", bf, ROWS, COLS);
const raw = args.type === "Q4_1" ? q41 : Uint8Array.from({ length: (q41.length / 20) * 18 }, (_, i) => q41[Math.floor(i / 18) * 20 + (i % 18 < 2 ? i % 18 : (i % 18) + 2)]!);
const img16 = rt.alloc(quantImageBytes("q4", ROWS, COLS));
const img8 = rt.alloc(quantImageBytes("q4a8", ROWS, COLS));
packStoredRows("q4", args.type, raw, rt.u8, img16, 0, ROWS, COLS, "bench", "w");
packStoredRows("q4a8", args.type, raw, rt.u8, img8, 0, ROWS, COLS, "bench", "w");
const levels: { T: number; i16Ms: number; i8Ms: number; speedup: number; i8Gmacs: number; maxDiff: number }[] = [];
for (const T of [1, 4, 16, 64]) {
  const xf = rt.alloc(T * COLS * 4),
    xq = rt.alloc(Math.ceil(T / 4) * COLS * 9 + 64),
    y16 = rt.alloc(T * ROWS * 4),
    y8 = rt.alloc(T * ROWS * 4);
  rt.f32.set(
    new Float32Array(T * COLS).map(() => rnd()),
    xf >> 2,
  );
  const time = (f: () => void): number => {
    for (let i = 0; i < 20; i++) f();
    const ts: number[] = [];
    for (let i = 0; i < 60; i++) {
      const t0 = performance.now();
      f();
      ts.push(performance.now() - t0);
    }
    return summarize(ts).median;
  };
  // interleaved: each sample of one is next to a sample of the other
  let a = 0,
    b = 0;
  for (let round = 0; round < 3; round++) {
    a += time(() => {
      rt.quantX(xf, xq, T, COLS);
      rt.matmulQ("q4", img16, xq, y16, T, COLS, ROWS);
    });
    b += time(() => {
      rt.quantX8(xf, xq, T, COLS);
      rt.matmulQ("q4a8", img8, xq, y8, T, COLS, ROWS);
    });
  }
  a /= 3;
  b /= 3;
  let err = 0,
    ref = 0;
  for (let i = 0; i < T * ROWS; i++) {
    err = Math.max(err, Math.abs(rt.f32[(y16 >> 2) + i]! - rt.f32[(y8 >> 2) + i]!));
    ref = Math.max(ref, Math.abs(rt.f32[(y16 >> 2) + i]!));
  }
  const gmacs = (T * ROWS * COLS) / b / 1e6;
  levels.push({ T, i16Ms: +a.toFixed(4), i8Ms: +b.toFixed(4), speedup: +(a / b).toFixed(3), i8Gmacs: +gmacs.toFixed(1), maxDiff: +err.toExponential(2) });
  console.log(
    `T=${T} ${ROWS}x${COLS} ${args.type}: 16-bit inputs ${a.toFixed(3)} ms (${((T * ROWS * COLS) / a / 1e6).toFixed(1)} GMAC/s), 8-bit ${b.toFixed(3)} ms (${gmacs.toFixed(1)} GMAC/s), speedup ${(a / b).toFixed(2)}; max |diff| ${err.toExponential(2)} of max |y| ${ref.toFixed(3)}`,
  );
  for (const [p, n] of [
    [xf, T * COLS * 4],
    [xq, Math.ceil(T / 4) * COLS * 9 + 64],
    [y16, T * ROWS * 4],
    [y8, T * ROWS * 4],
  ] as const)
    rt.free(p, n);
}
rt.close();
finalLine({ bench: "kernel-i8", rows: ROWS, cols: COLS, type: args.type, node: process.version, levels });
