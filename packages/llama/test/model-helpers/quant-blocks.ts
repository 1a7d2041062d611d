// Random GGUF quantized blocks (Q8_0 and Q4_1 through the model's own quantizer, the others as
// random integers and small finite scales), for kernel and loader tests.
import { f16Round, quantizeBf16Rows } from "../../src/kernels/quant-image.ts";
import { f32ToBf16 } from "./reference-math.ts";

export type QuantType = "Q8_0" | "Q4_0" | "Q4_1" | "Q4_K" | "Q6_K" | "Q5_0" | "Q5_1" | "Q5_K" | "Q3_K" | "IQ4_NL" | "IQ4_XS" | "MXFP4";

/** Stored block layouts of the types randomBlocks fills byte by byte: elements, bytes, and where f16 scales go (offset, low end, span). */
const RANDOM_LAYOUTS: Partial<Record<QuantType, { n: number; bytes: number; scales: [number, number, number][] }>> = {
  Q5_0: { n: 32, bytes: 22, scales: [[0, 0.01, 0.02]] },
  Q5_1: {
    n: 32,
    bytes: 24,
    scales: [
      [0, 0.005, 0.01],
      [2, -0.1, 0.05],
    ],
  },
  Q5_K: {
    n: 256,
    bytes: 176,
    scales: [
      [0, 0.0005, 0.001],
      [2, 0.0002, 0.001],
    ],
  },
  Q3_K: { n: 256, bytes: 110, scales: [[108, 0.0005, 0.001]] },
  IQ4_NL: { n: 32, bytes: 18, scales: [[0, 0.0002, 0.0004]] },
  IQ4_XS: { n: 256, bytes: 136, scales: [[0, 0.00001, 0.00002]] },
};

export /** Random stored blocks of `type` for [rows][cols] with small finite scales. */
function randomBlocks(type: QuantType, rows: number, cols: number, r: () => number): Uint8Array {
  const byte = () => Math.floor((r() + 0.5) * 256) & 0xff;
  const put16 = (out: Uint8Array, at: number, h: number) => {
    out[at] = h & 0xff;
    out[at + 1] = h >> 8;
  };
  const small = (lo: number, span: number) => f16Round(lo + Math.abs(r()) * span);
  const layout = RANDOM_LAYOUTS[type];
  if (layout) {
    const out = new Uint8Array((rows * cols * layout.bytes) / layout.n);
    for (let i = 0; i < out.length; i++) out[i] = byte();
    for (let b = 0; b < out.length / layout.bytes; b++) for (const [at, lo, span] of layout.scales) put16(out, b * layout.bytes + at, small(lo, span));
    return out;
  }
  if (type === "MXFP4") {
    // an E8M0 exponent byte in 117..124 (scales 2^-11 .. 2^-4), then 16 random nibble bytes
    const out = new Uint8Array((rows * cols * 17) / 32);
    for (let b = 0; b < out.length / 17; b++) {
      out[b * 17] = 117 + (byte() & 7);
      for (let k = 1; k < 17; k++) out[b * 17 + k] = byte();
    }
    return out;
  }
  if (type === "Q4_0") {
    const out = new Uint8Array((rows * cols * 18) / 32);
    for (let b = 0; b < out.length / 18; b++) {
      put16(out, b * 18, small(0.01, 0.02));
      for (let k = 0; k < 16; k++) out[b * 18 + 2 + k] = byte();
    }
    return out;
  }
  if (type === "Q4_K") {
    const out = new Uint8Array((rows * cols * 144) / 256);
    for (let b = 0; b < out.length / 144; b++) {
      put16(out, b * 144, small(0.0005, 0.001));
      put16(out, b * 144 + 2, small(0.0002, 0.001));
      for (let k = 4; k < 144; k++) out[b * 144 + k] = byte();
    }
    return out;
  }
  if (type === "Q6_K") {
    const out = new Uint8Array((rows * cols * 210) / 256);
    for (let b = 0; b < out.length / 210; b++) {
      for (let k = 0; k < 208; k++) out[b * 210 + k] = byte();
      put16(out, b * 210 + 208, small(0.0001, 0.0002));
    }
    return out;
  }
  const w = new Uint16Array(rows * cols).map(() => f32ToBf16(r() * 0.2));
  return quantizeBf16Rows(type as "Q8_0" | "Q4_1", w, rows, cols);
}
