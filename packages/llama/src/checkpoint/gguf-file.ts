// Parses a GGUF file (versions 2 and 3): header, metadata key/values and tensor infos, with every
// tensor's byte range checked against the file. Reads through a small buffer, never the whole file.
// Mapping to Hugging Face names, dequantisation and tokenizers live in the modules that use this.

import { closeSync, fstatSync, openSync, readSync } from "node:fs";
import { ModelLoadError } from "./model-load-error.ts";

/** GGML tensor types: id -> name, elements per block, bytes per block. */
export const GGML_TYPES: Record<number, { name: string; blockSize: number; typeSize: number }> = {
  0: { name: "F32", blockSize: 1, typeSize: 4 },
  1: { name: "F16", blockSize: 1, typeSize: 2 },
  2: { name: "Q4_0", blockSize: 32, typeSize: 18 },
  3: { name: "Q4_1", blockSize: 32, typeSize: 20 },
  6: { name: "Q5_0", blockSize: 32, typeSize: 22 },
  7: { name: "Q5_1", blockSize: 32, typeSize: 24 },
  8: { name: "Q8_0", blockSize: 32, typeSize: 34 },
  9: { name: "Q8_1", blockSize: 32, typeSize: 36 },
  10: { name: "Q2_K", blockSize: 256, typeSize: 84 },
  11: { name: "Q3_K", blockSize: 256, typeSize: 110 },
  12: { name: "Q4_K", blockSize: 256, typeSize: 144 },
  13: { name: "Q5_K", blockSize: 256, typeSize: 176 },
  14: { name: "Q6_K", blockSize: 256, typeSize: 210 },
  15: { name: "Q8_K", blockSize: 256, typeSize: 292 },
  20: { name: "IQ4_NL", blockSize: 32, typeSize: 18 },
  23: { name: "IQ4_XS", blockSize: 256, typeSize: 136 },
  24: { name: "I8", blockSize: 1, typeSize: 1 },
  25: { name: "I16", blockSize: 1, typeSize: 2 },
  26: { name: "I32", blockSize: 1, typeSize: 4 },
  39: { name: "MXFP4", blockSize: 32, typeSize: 17 },
  27: { name: "I64", blockSize: 1, typeSize: 8 },
  28: { name: "F64", blockSize: 1, typeSize: 8 },
  30: { name: "BF16", blockSize: 1, typeSize: 2 },
};

/** GGUF metadata value types. */
export const GgufValueType = {
  UINT8: 0,
  INT8: 1,
  UINT16: 2,
  INT16: 3,
  UINT32: 4,
  INT32: 5,
  FLOAT32: 6,
  BOOL: 7,
  STRING: 8,
  ARRAY: 9,
  UINT64: 10,
  INT64: 11,
  FLOAT64: 12,
} as const;

export type GgufValue = number | bigint | boolean | string | GgufValue[];

export interface GgufTensorInfo {
  /** GGUF name, e.g. `blk.0.attn_q.weight`. */
  name: string;
  /** GGUF dims, innermost first (ne[0] is the row length). */
  dims: number[];
  typeId: number;
  /** Type name (F32, Q4_1, ...). */
  type: string;
  /** Absolute byte offset in the file. */
  start: number;
  byteLength: number;
}

export interface GgufFile {
  path: string;
  version: number;
  alignment: number;
  metadata: Map<string, GgufValue>;
  tensors: GgufTensorInfo[];
  /** Open descriptor; close with closeGguf. */
  fd: number;
  size: number;
}

const MAGIC = 0x46554747; // "GGUF" little-endian
const BUFFER_BYTES = 1 << 20;
const MAX_STRING_BYTES = 64 << 20;
const MAX_COUNT = 2 ** 32;

/** Sequential little-endian reader over a file descriptor. */
class FileCursor {
  private buf = Buffer.alloc(BUFFER_BYTES);
  private bufStart = 0;
  private bufLen = 0;
  pos = 0;
  constructor(
    private readonly fd: number,
    private readonly path: string,
    readonly size: number,
  ) {}

  private ensure(n: number, what: string): void {
    if (this.pos + n > this.size) throw new ModelLoadError(this.path, `file ends while reading ${what} at offset ${this.pos}; the file is truncated`, { item: what });
    if (this.pos >= this.bufStart && this.pos + n <= this.bufStart + this.bufLen) return;
    if (n > this.buf.length) this.buf = Buffer.alloc(n);
    this.bufStart = this.pos;
    this.bufLen = 0;
    const want = Math.min(this.buf.length, this.size - this.pos);
    while (this.bufLen < want) {
      const got = readSync(this.fd, this.buf, this.bufLen, want - this.bufLen, this.bufStart + this.bufLen);
      if (got === 0) throw new ModelLoadError(this.path, `file ends while reading ${what}; the file is truncated`, { item: what });
      this.bufLen += got;
    }
  }

  private at(n: number, what: string): number {
    this.ensure(n, what);
    const off = this.pos - this.bufStart;
    this.pos += n;
    return off;
  }

  u8(what: string): number {
    return this.buf.readUInt8(this.at(1, what));
  }
  i8(what: string): number {
    return this.buf.readInt8(this.at(1, what));
  }
  u16(what: string): number {
    return this.buf.readUInt16LE(this.at(2, what));
  }
  i16(what: string): number {
    return this.buf.readInt16LE(this.at(2, what));
  }
  u32(what: string): number {
    return this.buf.readUInt32LE(this.at(4, what));
  }
  i32(what: string): number {
    return this.buf.readInt32LE(this.at(4, what));
  }
  f32(what: string): number {
    return this.buf.readFloatLE(this.at(4, what));
  }
  f64(what: string): number {
    return this.buf.readDoubleLE(this.at(8, what));
  }
  u64(what: string): bigint {
    return this.buf.readBigUInt64LE(this.at(8, what));
  }
  i64(what: string): bigint {
    return this.buf.readBigInt64LE(this.at(8, what));
  }
  /** A u64 that must fit a safe JS number and be at most `max`. */
  count(what: string, max: number): number {
    const v = this.u64(what);
    if (v > BigInt(max)) throw new ModelLoadError(this.path, `${what} is ${v}, more than ${max}; the file is corrupt`, { item: what });
    return Number(v);
  }
  string(what: string): string {
    const len = this.count(`${what} (string length)`, MAX_STRING_BYTES);
    const off = this.at(len, what);
    return this.buf.toString("utf8", off, off + len);
  }
}

function readValue(c: FileCursor, type: number, key: string, path: string): GgufValue {
  switch (type) {
    case GgufValueType.UINT8:
      return c.u8(key);
    case GgufValueType.INT8:
      return c.i8(key);
    case GgufValueType.UINT16:
      return c.u16(key);
    case GgufValueType.INT16:
      return c.i16(key);
    case GgufValueType.UINT32:
      return c.u32(key);
    case GgufValueType.INT32:
      return c.i32(key);
    case GgufValueType.FLOAT32:
      return c.f32(key);
    case GgufValueType.BOOL:
      return c.u8(key) !== 0;
    case GgufValueType.STRING:
      return c.string(key);
    case GgufValueType.UINT64:
      return c.u64(key);
    case GgufValueType.INT64:
      return c.i64(key);
    case GgufValueType.FLOAT64:
      return c.f64(key);
    case GgufValueType.ARRAY: {
      const elemType = c.u32(key);
      if (elemType === GgufValueType.ARRAY) throw new ModelLoadError(path, `metadata key "${key}" is a nested array, which is not supported`, { item: key });
      const n = c.count(`${key} (array length)`, MAX_COUNT);
      const out: GgufValue[] = new Array(n);
      for (let i = 0; i < n; i++) out[i] = readValue(c, elemType, key, path);
      return out;
    }
    default:
      throw new ModelLoadError(path, `metadata key "${key}" has unknown value type ${type}; the file is corrupt or from a newer GGUF version`, { item: key });
  }
}

/**
 * Opens and parses `path`. Supports GGUF versions 2 and 3 (little-endian). Checks the magic, every
 * tensor's type and that its data (at `general.alignment`) lies inside the file. Throws
 * ModelLoadError naming the file and the key or tensor on anything truncated, corrupt or unknown.
 */
export function openGguf(path: string): GgufFile {
  let fd: number;
  try {
    fd = openSync(path, "r");
  } catch (cause) {
    throw new ModelLoadError(path, `cannot open: ${(cause as Error).message}`, { cause });
  }
  try {
    const size = fstatSync(fd).size;
    const c = new FileCursor(fd, path, size);
    if (size < 4 || c.u32("magic") !== MAGIC) throw new ModelLoadError(path, `does not start with the GGUF magic; it is not a GGUF file`);
    const version = c.u32("version");
    if (version !== 2 && version !== 3) {
      const hint = version > 0xffff ? " (a big-endian file?)" : "";
      throw new ModelLoadError(path, `GGUF version ${version}${hint} is not supported; supported are 2 and 3`, { item: "version" });
    }
    const tensorCount = c.count("tensor_count", 1 << 24);
    const kvCount = c.count("metadata_kv_count", 1 << 24);
    const metadata = new Map<string, GgufValue>();
    for (let i = 0; i < kvCount; i++) {
      const key = c.string(`metadata key #${i}`);
      const type = c.u32(key);
      metadata.set(key, readValue(c, type, key, path));
    }
    const alignmentRaw = metadata.get("general.alignment") ?? 32;
    const alignment = Number(alignmentRaw);
    if (!Number.isInteger(alignment) || alignment <= 0 || alignment % 8 !== 0)
      throw new ModelLoadError(path, `general.alignment ${String(alignmentRaw)} must be a positive multiple of 8`, { item: "general.alignment" });
    const raw: Array<Omit<GgufTensorInfo, "start" | "byteLength"> & { offset: number }> = [];
    for (let i = 0; i < tensorCount; i++) {
      const name = c.string(`tensor info #${i} name`);
      const nDims = c.u32(`${name} n_dims`);
      if (nDims < 1 || nDims > 4) throw new ModelLoadError(path, `tensor "${name}" has ${nDims} dimensions; GGUF allows 1 to 4`, { item: name });
      const dims: number[] = [];
      for (let d = 0; d < nDims; d++) dims.push(c.count(`${name} dim ${d}`, 2 ** 40));
      const typeId = c.u32(`${name} type`);
      const offset = c.count(`${name} offset`, Number.MAX_SAFE_INTEGER);
      const t = GGML_TYPES[typeId];
      if (!t) throw new ModelLoadError(path, `tensor "${name}" has unknown GGML type ${typeId}`, { item: name });
      raw.push({ name, dims, typeId, type: t.name, offset });
    }
    const dataStart = Math.ceil(c.pos / alignment) * alignment;
    const tensors: GgufTensorInfo[] = raw.map(({ offset, ...t }) => {
      const info = GGML_TYPES[t.typeId]!;
      const elements = t.dims.reduce((a, b) => a * b, 1);
      if (t.dims[0]! % info.blockSize !== 0)
        throw new ModelLoadError(path, `tensor "${t.name}" row length ${t.dims[0]} is not a multiple of the ${t.type} block size ${info.blockSize}`, { item: t.name });
      if (offset % alignment !== 0) throw new ModelLoadError(path, `tensor "${t.name}" offset ${offset} is not aligned to ${alignment}`, { item: t.name });
      const byteLength = (elements / info.blockSize) * info.typeSize;
      const start = dataStart + offset;
      if (start + byteLength > size) {
        throw new ModelLoadError(path, `tensor "${t.name}" data [${start}, ${start + byteLength}) runs past the end of the file (${size} bytes); the file is truncated`, {
          item: t.name,
        });
      }
      return { ...t, start, byteLength };
    });
    return { path, version, alignment, metadata, tensors, fd, size };
  } catch (e) {
    closeSync(fd);
    throw e;
  }
}

/** Closes the file of a parsed GGUF. */
export function closeGguf(file: GgufFile): void {
  closeSync(file.fd);
}
