// Reads safetensors files (one file or a sharded set) as a TensorSource: parses each header,
// checks every tensor's byte range against the file, and copies tensors by file range straight
// into the caller's bf16 buffer. It never holds a whole shard in memory. Knows nothing of configs.

import { closeSync, fstatSync, openSync, readSync } from "node:fs";
import { createHash } from "node:crypto";
import { endianness } from "node:os";
import type { TensorInfo, TensorSource } from "../checkpoint-types.ts";
import { convertToBf16 } from "./bf16-convert.ts";
import { ModelLoadError } from "./model-load-error.ts";

const ELEMENT_BYTES: Record<string, number> = { BF16: 2, F16: 2, F32: 4 };
const CHUNK_BYTES = 4 << 20;
const MAX_HEADER_BYTES = 100 << 20;
const HOST_IS_LE = endianness() === "LE";

interface StoredTensor extends TensorInfo {
  fd: number;
  /** Absolute byte offset of the tensor's data in its file. */
  start: number;
  byteLength: number;
}

/** Parsed header of one safetensors file. */
export interface SafetensorsHeader {
  tensors: Array<{ name: string; dtype: string; shape: number[]; start: number; byteLength: number }>;
  metadata: Record<string, string>;
}

/** Reads exactly dst.length bytes at `position`; a short read is a ModelLoadError saying the file is truncated. */
export function readExactly(fd: number, file: string, dst: Uint8Array, position: number, what: string): void {
  let done = 0;
  while (done < dst.length) {
    const n = readSync(fd, dst, done, dst.length - done, position + done);
    if (n === 0) throw new ModelLoadError(file, `file ends before ${what} (wanted ${dst.length} bytes at offset ${position}); the file is truncated, download it again`);
    done += n;
  }
}

/**
 * Reads and validates the header of a safetensors file open on `fd`. Every tensor's range must lie
 * inside the file and match its dtype and shape. Throws ModelLoadError naming the file and tensor.
 */
export function readSafetensorsHeader(fd: number, file: string): SafetensorsHeader {
  const size = fstatSync(fd).size;
  if (size < 8) throw new ModelLoadError(file, `only ${size} bytes long; a safetensors file starts with an 8-byte header length`);
  const lenBuf = new Uint8Array(8);
  readExactly(fd, file, lenBuf, 0, "the header length");
  const headerLen = Number(new DataView(lenBuf.buffer).getBigUint64(0, true));
  if (headerLen > MAX_HEADER_BYTES || 8 + headerLen > size) {
    throw new ModelLoadError(file, `header length ${headerLen} runs past the file size ${size}; the file is corrupt or not safetensors`);
  }
  const headerBytes = new Uint8Array(headerLen);
  readExactly(fd, file, headerBytes, 8, "the end of the JSON header");
  let parsed: unknown;
  try {
    parsed = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(headerBytes));
  } catch (cause) {
    throw new ModelLoadError(file, `header is not valid UTF-8 JSON; the file is corrupt or not safetensors`, { cause });
  }
  if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) throw new ModelLoadError(file, `header is not a JSON object`);
  const dataStart = 8 + headerLen;
  const dataBytes = size - dataStart;
  const tensors: SafetensorsHeader["tensors"] = [];
  let metadata: Record<string, string> = {};
  for (const [name, value] of Object.entries(parsed as Record<string, unknown>)) {
    if (name === "__metadata__") {
      metadata = (value ?? {}) as Record<string, string>;
      continue;
    }
    const entry = value as { dtype?: unknown; shape?: unknown; data_offsets?: unknown };
    const { dtype, shape, data_offsets: offsets } = entry ?? {};
    if (
      typeof dtype !== "string" ||
      !Array.isArray(shape) ||
      !shape.every((d) => Number.isInteger(d) && d >= 0) ||
      !Array.isArray(offsets) ||
      offsets.length !== 2 ||
      !offsets.every((o) => Number.isInteger(o) && o >= 0)
    ) {
      throw new ModelLoadError(file, `tensor "${name}" has a malformed header entry (needs dtype, shape, data_offsets)`, { item: name });
    }
    const [begin, end] = offsets as [number, number];
    if (end < begin || end > dataBytes) {
      throw new ModelLoadError(file, `tensor "${name}" data_offsets [${begin}, ${end}] run past the ${dataBytes} data bytes in the file; the file is truncated or corrupt`, {
        item: name,
      });
    }
    const elementBytes = ELEMENT_BYTES[dtype];
    if (elementBytes !== undefined) {
      const count = (shape as number[]).reduce((a, b) => a * b, 1);
      if (count * elementBytes !== end - begin) {
        throw new ModelLoadError(file, `tensor "${name}" has ${end - begin} bytes but shape [${shape.join(", ")}] of ${dtype} needs ${count * elementBytes}`, { item: name });
      }
    }
    tensors.push({ name, dtype, shape: shape as number[], start: dataStart + begin, byteLength: end - begin });
  }
  return { tensors, metadata };
}

/** A TensorSource over one or more safetensors files. */
export class SafetensorsSource implements TensorSource {
  private readonly byName = new Map<string, StoredTensor>();
  private readonly fds: number[] = [];
  private readonly shaCache = new Map<string, string>();
  private readonly where: string;

  /**
   * Opens `files` (absolute paths). `where` names the checkpoint in errors about missing tensors.
   * Tensors of dtypes other than BF16/F16/F32 are listed but fail on read with ModelLoadError.
   * Throws ModelLoadError for unreadable or corrupt headers and for a tensor stored twice.
   */
  constructor(files: string[], where: string) {
    this.where = where;
    try {
      for (const file of files) {
        let fd: number;
        try {
          fd = openSync(file, "r");
        } catch (cause) {
          throw new ModelLoadError(file, `cannot open: ${(cause as Error).message}`, { cause });
        }
        this.fds.push(fd);
        for (const t of readSafetensorsHeader(fd, file).tensors) {
          const prior = this.byName.get(t.name);
          if (prior) throw new ModelLoadError(file, `tensor "${t.name}" is also stored in ${prior.file}`, { item: t.name });
          this.byName.set(t.name, { name: t.name, dtype: t.dtype, shape: t.shape, file, fd, start: t.start, byteLength: t.byteLength });
        }
      }
    } catch (e) {
      this.close();
      throw e;
    }
  }

  list(): TensorInfo[] {
    return [...this.byName.values()].map(({ name, dtype, shape, file }) => ({ name, dtype, shape: [...shape], file }));
  }

  has(name: string): boolean {
    return this.byName.has(name);
  }

  info(name: string): TensorInfo {
    const { dtype, shape, file } = this.stored(name);
    return { name, dtype, shape: [...shape], file };
  }

  private stored(name: string): StoredTensor {
    const t = this.byName.get(name);
    if (!t) throw new ModelLoadError(this.where, `tensor "${name}" is missing from the checkpoint`, { item: name });
    return t;
  }

  readBf16(name: string, dst: Uint16Array): void {
    const t = this.stored(name);
    const count = t.shape.reduce((a, b) => a * b, 1);
    const dtype = t.dtype;
    if (dtype !== "BF16" && dtype !== "F16" && dtype !== "F32") {
      throw new ModelLoadError(t.file, `tensor "${name}" has dtype ${dtype}; supported are BF16, F16 and F32`, { item: name });
    }
    if (dst.length !== count) {
      throw new ModelLoadError(t.file, `tensor "${name}" has ${count} elements but the destination holds ${dst.length}`, { item: name });
    }
    if (dtype === "BF16" && HOST_IS_LE) {
      readExactly(t.fd, t.file, new Uint8Array(dst.buffer, dst.byteOffset, count * 2), t.start, `the end of tensor "${name}"`);
      return;
    }
    const elementBytes = ELEMENT_BYTES[dtype]!;
    const perChunk = Math.max(1, Math.floor(CHUNK_BYTES / elementBytes));
    const chunk = new Uint8Array(Math.min(count, perChunk) * elementBytes);
    for (let done = 0; done < count; done += perChunk) {
      const n = Math.min(perChunk, count - done);
      const view = chunk.subarray(0, n * elementBytes);
      readExactly(t.fd, t.file, view, t.start + done * elementBytes, `the end of tensor "${name}"`);
      convertToBf16(dtype, view, 0, n, dst, done);
    }
  }

  sha256(name: string): string {
    const cached = this.shaCache.get(name);
    if (cached) return cached;
    const t = this.stored(name);
    const hash = createHash("sha256");
    const chunk = new Uint8Array(Math.min(CHUNK_BYTES, Math.max(1, t.byteLength)));
    for (let done = 0; done < t.byteLength; done += chunk.length) {
      const view = chunk.subarray(0, Math.min(chunk.length, t.byteLength - done));
      readExactly(t.fd, t.file, view, t.start + done, `the end of tensor "${name}"`);
      hash.update(view);
    }
    const hex = hash.digest("hex");
    this.shaCache.set(name, hex);
    return hex;
  }

  close(): void {
    for (const fd of this.fds.splice(0)) closeSync(fd);
  }
}
