// The compiled-artifact cache: a folder of files keyed by sha-256 of (weights fingerprint,
// variant, kernel version, artifact kind). On an NPU an artifact is a compiled graph; on the CPU
// backend it is the packed, kernel-ready weight image. Writes are atomic (temp file + rename) and
// every read checks length and CRC-32, so a torn or damaged file is a miss, never wrong weights.

import { createHash } from "node:crypto";
import { closeSync, existsSync, fsyncSync, mkdirSync, openSync, readSync, renameSync, rmSync, statSync, writeSync } from "node:fs";
import { join } from "node:path";
import { crc32 } from "@node-rs/crc32";
import type { EngineVariant } from "@airm/rm-core";

const MAGIC = "AIRMART1";
const HEADER_BYTES = 4096;

/** What an artifact is built from; equal parts give equal keys. */
export interface ArtifactKeyParts {
  /** sha-256 hex of config + weights (Checkpoint.fingerprint). */
  weightsFingerprint: string;
  /** The compiled variant, or null when the artifact serves every variant (shared weights). */
  variant: EngineVariant | null;
  /** Kernel version / numerics fingerprint: a kernel change must miss the cache. */
  kernelVersion: string;
  /** `packed-weights`, `rbln-graph`, ... */
  kind: string;
}

/** sha-256 hex over the canonical form of `parts`. */
/** Bytes per read or write call (fs allows under 2 GiB) and per CRC-32 update. */
const READ_CHUNK = 1 << 30;

export function artifactKey(parts: ArtifactKeyParts): string {
  const canon = JSON.stringify(["airm-artifact/1", parts.kind, parts.weightsFingerprint, parts.variant ? [parts.variant.batch, parts.variant.seqLen] : null, parts.kernelVersion]);
  return createHash("sha256").update(canon).digest("hex");
}

export interface ArtifactMeta {
  key: string;
  kind: string;
  bytes: number;
  crc32: number;
  parts: ArtifactKeyParts;
  createdAt: string;
}

/** A folder of artifacts. One file per key: a 4 KiB JSON header, then the payload. */
export class ArtifactCache {
  readonly dir: string;
  constructor(dir: string) {
    this.dir = dir;
  }

  /** The file that holds `key`. */
  pathFor(key: string): string {
    if (!/^[0-9a-f]{64}$/.test(key)) throw new TypeError(`artifact key must be 64 hex digits, got "${key}"`);
    return join(this.dir, `${key}.art`);
  }

  has(key: string): boolean {
    return existsSync(this.pathFor(key));
  }

  /** The header of `key`, or null when absent or unreadable. */
  meta(key: string): ArtifactMeta | null {
    const file = this.pathFor(key);
    if (!existsSync(file)) return null;
    const fd = openSync(file, "r");
    try {
      const head = Buffer.alloc(HEADER_BYTES);
      if (readSync(fd, head, 0, HEADER_BYTES, 0) !== HEADER_BYTES) return null;
      const text = head.toString("utf8").replace(/\0+$/, "");
      if (!text.startsWith(MAGIC)) return null;
      return JSON.parse(text.slice(MAGIC.length)) as ArtifactMeta;
    } catch {
      return null;
    } finally {
      closeSync(fd);
    }
  }

  /**
   * The payload of `key`, or null on a miss. A file whose length or CRC-32 does not match its
   * header counts as a miss and is removed (it will be rebuilt).
   */
  read(key: string): Uint8Array | null {
    const meta = this.meta(key);
    if (!meta || meta.key !== key) return null;
    const file = this.pathFor(key);
    // Read in chunks: readFileSync stops at 2 GiB, and packed images of large models pass it.
    const size = statSync(file).size;
    if (size - HEADER_BYTES !== meta.bytes) {
      rmSync(file, { force: true });
      return null;
    }
    const payload = new Uint8Array(meta.bytes);
    const fd = openSync(file, "r");
    try {
      for (let at = 0; at < payload.length; ) {
        const n = readSync(fd, payload, at, Math.min(READ_CHUNK, payload.length - at), HEADER_BYTES + at);
        if (n === 0) break;
        at += n;
      }
    } finally {
      closeSync(fd);
    }
    let crc = 0;
    for (let at = 0; at < payload.length; at += READ_CHUNK) crc = crc32(payload.subarray(at, Math.min(payload.length, at + READ_CHUNK)), crc);
    if (crc !== meta.crc32) {
      rmSync(file, { force: true });
      return null;
    }
    return payload;
  }

  /**
   * A reader of `key`'s payload in order, straight into the caller's buffers (a large packed
   * image is never held twice), or null on a miss or a length that does not match the header.
   * `verify()` after the last byte: false when the CRC-32 does not match (the file is removed;
   * discard what was read). Close it either way.
   */
  reader(key: string): { byteLength: number; readNext(dst: Uint8Array): void; verify(): boolean; close(): void } | null {
    const meta = this.meta(key);
    if (!meta || meta.key !== key) return null;
    const file = this.pathFor(key);
    if (statSync(file).size - HEADER_BYTES !== meta.bytes) {
      rmSync(file, { force: true });
      return null;
    }
    const fd = openSync(file, "r");
    let at = 0;
    let crc = 0;
    let open = true;
    return {
      byteLength: meta.bytes,
      readNext(dst: Uint8Array): void {
        if (at + dst.length > meta.bytes) throw new RangeError(`artifact ${key.slice(0, 12)}: read past its ${meta.bytes} bytes`);
        for (let done = 0; done < dst.length; ) {
          const n = readSync(fd, dst, done, Math.min(READ_CHUNK, dst.length - done), HEADER_BYTES + at + done);
          if (n === 0) throw new RangeError(`artifact ${key.slice(0, 12)}: the file ended early`);
          crc = crc32(dst.subarray(done, done + n), crc);
          done += n;
        }
        at += dst.length;
      },
      verify: (): boolean => {
        const ok = at === meta.bytes && crc === meta.crc32;
        if (!ok) rmSync(file, { force: true });
        return ok;
      },
      close: (): void => {
        if (open) closeSync(fd);
        open = false;
      },
    };
  }

  /** Stores `segments` (concatenated) under the key of `parts`, atomically. Returns the key. */
  write(parts: ArtifactKeyParts, segments: Uint8Array[]): string {
    const key = artifactKey(parts);
    mkdirSync(this.dir, { recursive: true });
    let crc = 0;
    let bytes = 0;
    for (const s of segments) {
      crc = crc32(s, crc);
      bytes += s.length;
    }
    const meta: ArtifactMeta = { key, kind: parts.kind, bytes, crc32: crc, parts, createdAt: new Date().toISOString() };
    const head = Buffer.alloc(HEADER_BYTES);
    const text = MAGIC + JSON.stringify(meta);
    if (Buffer.byteLength(text) > HEADER_BYTES) throw new RangeError("artifact header too large");
    head.write(text, "utf8");
    const file = this.pathFor(key);
    const tmp = `${file}.${process.pid}.${Date.now()}.tmp`;
    const fd = openSync(tmp, "w");
    try {
      writeSync(fd, head);
      for (const s of segments) {
        let off = 0;
        while (off < s.length) off += writeSync(fd, s, off, Math.min(READ_CHUNK, s.length - off));
      }
      fsyncSync(fd);
    } catch (e) {
      closeSync(fd);
      rmSync(tmp, { force: true });
      throw e;
    }
    closeSync(fd);
    renameSync(tmp, file);
    return key;
  }

  /** Bytes on disk for `key` (header included), or 0. */
  sizeOf(key: string): number {
    try {
      return statSync(this.pathFor(key)).size;
    } catch {
      return 0;
    }
  }

  remove(key: string): void {
    rmSync(this.pathFor(key), { force: true });
  }
}
