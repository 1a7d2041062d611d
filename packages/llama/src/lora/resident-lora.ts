// A LoRA adapter's matrices in the kernels' memory, and their update applied to the outputs of a
// fused matmul for a block of tokens, each token with its own adapter (or none). The kernels
// (kernels.wat lora_update, lora_update2, lora_update4) do each token's arithmetic on its own row
// in one order, so a token gets the same bits whichever adapters its neighbours in the batch use
// and whichever tile it falls in; they run on the calling thread only.
import type { KernelRuntime } from "../kernels/kernel-runtime.ts";
import type { ModelConfig } from "../checkpoint-types.ts";
import type { LoraModuleWeights } from "./read-adapter.ts";
import { GROUP_PROJECTIONS, LORA_PROJECTIONS, type LoraGroup, projectionShape } from "./projections.ts";

/** One module in memory: A f32 [r][cols] at `a`, B f32 [rows][rp] at `b` (zero past r), its output rows' offset in the fused matmul. */
export interface ResidentModule {
  a: number;
  b: number;
  cols: number;
  r: number;
  rows: number;
  rowOffset: number;
  scale: number;
}

/** An adapter in memory: one allocation, and its modules by layer and projection (LORA_PROJECTIONS order). */
export interface ResidentLora {
  ptr: number;
  bytes: number;
  modules: (ResidentModule | undefined)[][];
}

/** f32 values r rounded up to 4 (the width of the update's lane sums). */
export const paddedRank = (r: number): number => (r + 3) & ~3;

/** Writes an adapter's modules into one allocation of `rt`: A as stored, B with its rows padded to paddedRank(r) with zeros. */
export function placeAdapter(rt: KernelRuntime, model: ModelConfig, r: number, scale: number, weights: LoraModuleWeights[]): ResidentLora {
  const rp = paddedRank(r);
  const sizeOf = (m: LoraModuleWeights) => {
    const s = projectionShape(model, m.proj);
    return { s, aBytes: Math.ceil((r * s.in * 4) / 64) * 64, bBytes: Math.ceil((s.out * rp * 4) / 64) * 64 };
  };
  const bytes = weights.reduce((acc, m) => acc + sizeOf(m).aBytes + sizeOf(m).bBytes, 0);
  const ptr = rt.alloc(bytes);
  const modules: (ResidentModule | undefined)[][] = Array.from({ length: model.numLayers }, () => LORA_PROJECTIONS.map(() => undefined));
  let at = ptr;
  for (const m of weights) {
    const { s, aBytes, bBytes } = sizeOf(m);
    const f32 = rt.f32;
    f32.set(m.a, at >>> 2);
    for (let o = 0; o < s.out; o++) f32.set(m.b.subarray(o * r, (o + 1) * r), ((at + aBytes) >>> 2) + o * rp);
    modules[m.layer][LORA_PROJECTIONS.indexOf(m.proj)] = { a: at, b: at + aBytes, cols: s.in, r, rows: s.out, rowOffset: s.rowOffset, scale };
    at += aBytes + bBytes;
  }
  return { ptr, bytes, modules };
}

/** Where a fused matmul's inputs and outputs of a block's first token are, and the bytes from one token's row to the next. */
export interface MatmulRows {
  x: number;
  xStride: number;
  y: number;
  yStride: number;
}

/**
 * Adds each token's adapter update to the outputs of fused matmul `group` of `layer` for tokens
 * [t0, t0 + n) of a pass (`perToken[t]`: token t's adapter, or undefined for the base model). The
 * tokens of one adapter go to the kernel together, wherever they are in the pass, in tiles that
 * read its A and B once (KernelRuntime.loraUpdateRows: the same bits in any tile); `u` is the
 * kernel's scratch.
 */
export function applyLora(
  rt: KernelRuntime,
  perToken: readonly (ResidentLora | undefined)[],
  t0: number,
  n: number,
  layer: number,
  group: LoraGroup,
  io: MatmulRows,
  u: number,
): void {
  const tokensOf = new Map<ResidentLora, number[]>();
  for (let t = 0; t < n; t++) {
    const lora = perToken[t0 + t];
    if (!lora) continue;
    const list = tokensOf.get(lora);
    if (list) list.push(t);
    else tokensOf.set(lora, [t]);
  }
  for (const [lora, tokens] of tokensOf) {
    const xs = tokens.map((t) => io.x + t * io.xStride);
    for (const p of GROUP_PROJECTIONS[group]) {
      const m = lora.modules[layer][LORA_PROJECTIONS.indexOf(p)];
      if (m)
        rt.loraUpdateRows(
          xs,
          tokens.map((t) => io.y + t * io.yStride + m.rowOffset * 4),
          m,
          u,
        );
    }
  }
}
