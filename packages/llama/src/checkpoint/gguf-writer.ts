// A GGUF writer (versions 2 and 3): typed metadata, tensor infos with alignment, and tensor data
// given as raw bytes. The LoRA converter writes llama.cpp's adapter files with it; the tests build
// GGUF models with it. The reader is gguf-file.ts.

import { writeFileSync } from "node:fs";

export type MetaValue =
  | { type: "u8" | "i8" | "u16" | "i16" | "u32" | "i32" | "f32" | "f64" | "bool"; value: number | boolean }
  | { type: "u64" | "i64"; value: bigint }
  | { type: "str"; value: string }
  | { type: "arr"; elem: "str"; value: string[] }
  | { type: "arr"; elem: "i32" | "u32" | "f32"; value: number[] };

export const u32 = (value: number): MetaValue => ({ type: "u32", value });
export const f32 = (value: number): MetaValue => ({ type: "f32", value });
export const str = (value: string): MetaValue => ({ type: "str", value });
export const strs = (value: string[]): MetaValue => ({ type: "arr", elem: "str", value });
export const i32s = (value: number[]): MetaValue => ({ type: "arr", elem: "i32", value });

export interface GgufTensor {
  name: string;
  /** GGUF dims (innermost first). */
  dims: number[];
  typeId: number;
  data: Uint8Array;
}

const VT: Record<string, number> = { u8: 0, i8: 1, u16: 2, i16: 3, u32: 4, i32: 5, f32: 6, bool: 7, str: 8, arr: 9, u64: 10, i64: 11, f64: 12 };

class Bytes {
  parts: Buffer[] = [];
  length = 0;
  push(b: Buffer): void {
    this.parts.push(b);
    this.length += b.length;
  }
  u32(v: number): void {
    const b = Buffer.alloc(4);
    b.writeUInt32LE(v);
    this.push(b);
  }
  u64(v: number | bigint): void {
    const b = Buffer.alloc(8);
    b.writeBigUInt64LE(BigInt(v));
    this.push(b);
  }
  str(s: string): void {
    const b = Buffer.from(s, "utf8");
    this.u64(b.length);
    this.push(b);
  }
  scalar(type: string, v: number | boolean | bigint): void {
    const b = Buffer.alloc({ u8: 1, i8: 1, bool: 1, u16: 2, i16: 2, u32: 4, i32: 4, f32: 4, u64: 8, i64: 8, f64: 8 }[type]!);
    switch (type) {
      case "u8":
        b.writeUInt8(v as number);
        break;
      case "i8":
        b.writeInt8(v as number);
        break;
      case "bool":
        b.writeUInt8(v ? 1 : 0);
        break;
      case "u16":
        b.writeUInt16LE(v as number);
        break;
      case "i16":
        b.writeInt16LE(v as number);
        break;
      case "u32":
        b.writeUInt32LE(v as number);
        break;
      case "i32":
        b.writeInt32LE(v as number);
        break;
      case "f32":
        b.writeFloatLE(v as number);
        break;
      case "f64":
        b.writeDoubleLE(v as number);
        break;
      case "u64":
        b.writeBigUInt64LE(v as bigint);
        break;
      case "i64":
        b.writeBigInt64LE(v as bigint);
        break;
    }
    this.push(b);
  }
}

/** A tensor's info for the header: its data's byte length instead of the data. */
export interface GgufTensorLayout {
  name: string;
  dims: number[];
  typeId: number;
  bytes: number;
}

/**
 * The file up to its tensor data (magic, version, metadata, tensor infos, padding to the
 * alignment) and where each tensor's data starts after it: for writers that stream the data.
 */
export function ggufHeader(opts: { version?: 2 | 3; metadata: Record<string, MetaValue>; tensors: GgufTensorLayout[]; alignment?: number }): {
  header: Buffer;
  offsets: number[];
  alignment: number;
} {
  const alignment = opts.alignment ?? 32;
  const meta = { ...opts.metadata };
  if (alignment !== 32) meta["general.alignment"] = u32(alignment);
  const out = new Bytes();
  out.push(Buffer.from("GGUF", "ascii"));
  out.u32(opts.version ?? 3);
  out.u64(opts.tensors.length);
  out.u64(Object.keys(meta).length);
  for (const [key, v] of Object.entries(meta)) {
    out.str(key);
    out.u32(VT[v.type]!);
    if (v.type === "str") out.str(v.value);
    else if (v.type === "arr") {
      out.u32(VT[v.elem]!);
      out.u64(v.value.length);
      for (const e of v.value) {
        if (v.elem === "str") out.str(e as string);
        else out.scalar(v.elem, e as number);
      }
    } else out.scalar(v.type, v.value);
  }
  let offset = 0;
  const offsets: number[] = [];
  for (const t of opts.tensors) {
    offsets.push(offset);
    offset += Math.ceil(t.bytes / alignment) * alignment;
  }
  opts.tensors.forEach((t, i) => {
    out.str(t.name);
    out.u32(t.dims.length);
    for (const d of t.dims) out.u64(d);
    out.u32(t.typeId);
    out.u64(offsets[i]!);
  });
  out.push(Buffer.alloc(Math.ceil(out.length / alignment) * alignment - out.length));
  return { header: Buffer.concat(out.parts), offsets, alignment };
}

/** Serialises a GGUF file. `alignment` is written as general.alignment unless it is 32. */
export function ggufBytes(opts: { version?: 2 | 3; metadata: Record<string, MetaValue>; tensors: GgufTensor[]; alignment?: number }): Buffer {
  const { header, offsets } = ggufHeader({ ...opts, tensors: opts.tensors.map((t) => ({ ...t, bytes: t.data.length })) });
  const parts: Buffer[] = [header];
  opts.tensors.forEach((t, i) => {
    parts.push(Buffer.from(t.data));
    const next = i + 1 < opts.tensors.length ? offsets[i + 1]! : offsets[i]! + t.data.length;
    parts.push(Buffer.alloc(next - offsets[i]! - t.data.length));
  });
  return Buffer.concat(parts);
}

/** Writes `ggufBytes(opts)` to `path`. */
export function writeGguf(path: string, opts: Parameters<typeof ggufBytes>[0]): void {
  writeFileSync(path, ggufBytes(opts));
}
