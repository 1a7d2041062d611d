// The kernel-ready image of a bf16 weight matrix: rows in groups of 4, interleaved per block of 8
// columns (64 bytes per block per group), the rows % 4 tail rows plain after the last group.
// Knows the layout only; see wat/kernels.wat for why it looks like this.

/** Writes `rows`x`cols` row-major bf16 `src` into `dst[dstOff..]` in the interleaved layout. */
export function interleaveRows(src: Uint16Array, dst: Uint16Array, dstOff: number, rows: number, cols: number): void {
  const groups = rows >> 2;
  const blocks = cols >> 3;
  for (let g = 0; g < groups; g++) {
    const gBase = dstOff + g * 4 * cols;
    for (let j = 0; j < 4; j++) {
      const sRow = (4 * g + j) * cols;
      for (let b = 0; b < blocks; b++) {
        const d = gBase + b * 32 + j * 8;
        const s = sRow + b * 8;
        dst[d] = src[s];
        dst[d + 1] = src[s + 1];
        dst[d + 2] = src[s + 2];
        dst[d + 3] = src[s + 3];
        dst[d + 4] = src[s + 4];
        dst[d + 5] = src[s + 5];
        dst[d + 6] = src[s + 6];
        dst[d + 7] = src[s + 7];
      }
    }
  }
  const tail = groups * 4 * cols;
  dst.set(src.subarray(tail, rows * cols), dstOff + tail);
}

/** Index (in bf16 units, from the image start) of element (r, c) of the interleaved image. */
export function imageIndex(r: number, c: number, rows: number, cols: number): number {
  if (r < (rows & ~3)) return (r >> 2) * 4 * cols + (c >> 3) * 32 + (r & 3) * 8 + (c & 7);
  return r * cols + c;
}
