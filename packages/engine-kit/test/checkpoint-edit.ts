// Test helper: copies a single-file safetensors model folder and changes the bytes of some
// tensors, giving a "new checkpoint" that differs from the old one in exactly those tensors.
import { copyFileSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";

/**
 * Copies `from` to `to`, replacing every value of each named bf16 tensor by `value(i, old)`.
 * Returns the names it changed. Throws if a name is missing (the test is then wrong).
 */
export function editCheckpoint(from: string, to: string, edits: Record<string, (i: number, old: number) => number>): string[] {
  mkdirSync(to, { recursive: true });
  for (const f of readdirSync(from)) if (f !== "model.safetensors") copyFileSync(join(from, f), join(to, f));
  const bytes = new Uint8Array(readFileSync(join(from, "model.safetensors")));
  const headerLen = Number(new DataView(bytes.buffer).getBigUint64(0, true));
  const header = JSON.parse(new TextDecoder().decode(bytes.subarray(8, 8 + headerLen))) as Record<string, { dtype: string; data_offsets: [number, number] }>;
  const base = 8 + headerLen;
  for (const [name, fn] of Object.entries(edits)) {
    const t = header[name];
    if (t?.dtype !== "BF16") throw new Error(`editCheckpoint: no BF16 tensor ${name}`);
    const view = new Uint16Array(bytes.buffer, base + t.data_offsets[0], (t.data_offsets[1] - t.data_offsets[0]) / 2);
    for (let i = 0; i < view.length; i++) view[i] = fn(i, view[i]) & 0xffff;
  }
  writeFileSync(join(to, "model.safetensors"), bytes);
  return Object.keys(edits).sort();
}

/** bf16 bits of a small float (exact for values with <= 8 significant bits). */
export function bf16(x: number): number {
  const f = new Float32Array([x]);
  return new Uint32Array(f.buffer)[0] >>> 16;
}
