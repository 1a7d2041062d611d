// Socket reads for a frame parser that says where its next bytes go (nextBuffer) and is told how
// many arrived (onRead). Large destinations (a blob's payload) are read into directly, at most
// 256 KiB per read, so the kernel copies payload bytes once and they are still in cache when
// checksummed; everything else (headers, keys, short answers) is read into
// a staging buffer and handed out from there, so a burst of small frames costs one read and one
// callback instead of two per frame.

/** What the socket's reader feeds. */
export interface FrameSink {
  /** Where the next bytes go: the exact rest of the current header, key or payload (never empty). */
  nextBuffer(): Uint8Array;
  /** `n` bytes were written into the buffer nextBuffer() returned. */
  onRead(n: number): void;
  /** True once the sink stopped (a rejected frame): bytes still staged are dropped. */
  readonly closed: boolean;
}

/** Staging buffer size; a destination at least this large is read into directly. */
export const STAGE_BYTES = 64 * 1024;

/**
 * The most one direct read asks for. The CRC-32 of each read's bytes is taken right after it; the
 * kernel hands out up to ~1.3 MB per read on loopback, and bytes that many are no longer in this
 * core's cache by then. Receiving 64 MiB here: uncapped 31-35 ms with 8.1 ms of CRC, capped at
 * 256 KiB 27.5-29.7 ms with 4.4-5.1 ms of CRC (the extra reads cost less than the cache misses).
 */
export const MAX_DIRECT_BYTES = 256 * 1024;

/** The `onread` option of net.connect / new net.Socket for a sink. */
export function stagedOnRead(sink: FrameSink, stageBytes = STAGE_BYTES): { buffer: () => Uint8Array; callback: (n: number) => boolean } {
  const stage = Buffer.allocUnsafe(stageBytes);
  let direct = false;
  return {
    buffer: () => {
      const dst = sink.nextBuffer();
      direct = dst.byteLength >= stageBytes;
      if (!direct) return stage;
      return dst.byteLength > MAX_DIRECT_BYTES ? dst.subarray(0, MAX_DIRECT_BYTES) : dst;
    },
    callback: (n: number) => {
      if (direct) {
        sink.onRead(n);
        return true;
      }
      feed(sink, stage, 0, n);
      return true;
    },
  };
}

/** Copies `chunk[from, to)` into the sink, frame part by frame part. */
export function feed(sink: FrameSink, chunk: Uint8Array, from: number, to: number): void {
  let off = from;
  while (off < to && !sink.closed) {
    const dst = sink.nextBuffer();
    const n = Math.min(dst.byteLength, to - off);
    dst.set(chunk.subarray(off, off + n));
    off += n;
    sink.onRead(n);
  }
}
