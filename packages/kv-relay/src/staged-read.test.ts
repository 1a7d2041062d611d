// The staged reader against a small length-prefixed parser, with a "kernel" that hands out the
// stream in random-sized reads: every frame must come out whole and in order, small frames must
// share reads, and large payloads must be read straight into their destination.

import { expect, test } from "vitest";
import { STAGE_BYTES, stagedOnRead, type FrameSink } from "./staged-read.ts";

/** Frames of [u32 length][payload]; payloads land in their own buffers. */
class LengthPrefixed implements FrameSink {
  closed = false;
  readonly frames: Uint8Array[] = [];
  private readonly hdr = new Uint8Array(4);
  private hdrFill = 0;
  private body: Uint8Array | undefined;
  private fill = 0;

  nextBuffer(): Uint8Array {
    return this.body ? this.body.subarray(this.fill) : this.hdr.subarray(this.hdrFill);
  }

  onRead(n: number): void {
    if (!this.body) {
      this.hdrFill += n;
      if (this.hdrFill < 4) return;
      this.hdrFill = 0;
      const len = new DataView(this.hdr.buffer).getUint32(0, true);
      if (len === 0) this.frames.push(new Uint8Array(0));
      else {
        this.body = new Uint8Array(len);
        this.fill = 0;
      }
      return;
    }
    this.fill += n;
    if (this.fill === this.body.byteLength) {
      this.frames.push(this.body);
      this.body = undefined;
    }
  }
}

function stream(payloads: Uint8Array[]): Uint8Array {
  const parts: Uint8Array[] = [];
  for (const p of payloads) {
    const h = new Uint8Array(4);
    new DataView(h.buffer).setUint32(0, p.byteLength, true);
    parts.push(h, p);
  }
  return Buffer.concat(parts);
}

function randomPayload(len: number, seed: number): Uint8Array {
  const out = new Uint8Array(len);
  for (let i = 0; i < len; i++) out[i] = (seed * 31 + i * 7) & 0xff;
  return out;
}

/** Feeds `bytes` through onread as a kernel would: up to `maxRead` bytes into whatever buffer() returns. */
function deliver(sink: FrameSink, bytes: Uint8Array, maxRead: () => number): { reads: number; direct: number } {
  const r = stagedOnRead(sink);
  let off = 0;
  let reads = 0;
  let direct = 0;
  let stage: Uint8Array | undefined;
  while (off < bytes.byteLength) {
    const buf = r.buffer();
    // The staging buffer is one object, handed out whenever the destination is small.
    stage ??= buf;
    const n = Math.min(buf.byteLength, maxRead(), bytes.byteLength - off);
    buf.set(bytes.subarray(off, off + n));
    if (buf !== stage) direct++;
    off += n;
    reads++;
    r.callback(n);
  }
  return { reads, direct };
}

test("frames split at every kind of boundary come out whole and in order", () => {
  let seed = 1;
  const rnd = () => {
    seed = (seed * 1103515245 + 12345) & 0x7fffffff;
    return seed;
  };
  const sizes = [0, 1, 3, 200, 4096, STAGE_BYTES - 1, STAGE_BYTES, STAGE_BYTES + 1, 300_000, 5, 1 << 20, 17];
  const payloads = sizes.map((n, i) => randomPayload(n, i + 1));
  for (const maxRead of [1, 7, 4099, 65_536, 1 << 22]) {
    const sink = new LengthPrefixed();
    deliver(sink, stream(payloads), () => 1 + (rnd() % maxRead));
    expect(sink.frames.length, `frames with reads of up to ${maxRead} bytes`).toBe(payloads.length);
    sink.frames.forEach((f, i) => expect(Buffer.from(f).equals(payloads[i]), `frame ${i} (${sizes[i]} bytes), reads up to ${maxRead}`).toBe(true));
  }
});

test("a burst of small frames costs one read; a large payload is read into its destination", () => {
  const small = Array.from({ length: 64 }, (_, i) => randomPayload(300, i));
  const sink = new LengthPrefixed();
  const { reads } = deliver(sink, stream(small), () => 1 << 20);
  expect(reads).toBe(1);
  expect(sink.frames.length).toBe(64);

  const big = randomPayload(1 << 20, 9);
  const sink2 = new LengthPrefixed();
  const { direct } = deliver(sink2, stream([big]), () => 128 * 1024);
  // The first read is staged (it carries the header); the rest of the MiB goes straight in.
  expect(direct).toBeGreaterThanOrEqual(6);
  expect(Buffer.from(sink2.frames[0]).equals(big)).toBe(true);
});

test("a sink that closes mid-chunk gets no more bytes", () => {
  const sink = new LengthPrefixed();
  const payloads = [randomPayload(10, 1), randomPayload(10, 2), randomPayload(10, 3)];
  const origOnRead = sink.onRead.bind(sink);
  sink.onRead = (n: number) => {
    origOnRead(n);
    if (sink.frames.length === 1) sink.closed = true;
  };
  deliver(sink, stream(payloads), () => 1 << 20);
  expect(sink.frames.length).toBe(1);
});
