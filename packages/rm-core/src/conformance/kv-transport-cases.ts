// The KV transport conformance cases, as data: each has an id, a title and run(ctx) asserting
// with node:assert. The vitest suite and the airm-conformance CLI both run exactly these.

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import type { KVTransport, PulledBlob } from "../contracts.ts";
import { isAirmError, KVIntegrityError } from "../errors.ts";
import { blobKey, manifestKey } from "../kv-key.ts";
import { KV_LAYOUT, blockLayerBytes, blocksFor, zeroBlockTailK, zeroBlockTailV, type KVGeometry } from "../kv-layout.ts";
import { decodeManifest, encodeManifest, kvCrc32, verifyBlob, type KVManifest } from "../kv-manifest.ts";

export interface KVCaseContext {
  /** The pushing side. */
  producer: KVTransport;
  /** The pulling side: a second endpoint of the same transport. */
  consumer: KVTransport;
  /** A request id unique to this case run. */
  rid(suffix?: string): string;
}

export interface ConformanceCase<C> {
  id: string;
  title: string;
  run(ctx: C): Promise<void>;
}

/** Deterministic bytes for a (seed, length): a cheap xorshift so 64 MiB fills in well under a second. */
export function patternBytes(seed: number, length: number): Uint8Array {
  const out = new Uint8Array(length);
  const words = new Uint32Array(out.buffer, 0, length >>> 2);
  let x = (seed * 2654435761) >>> 0 || 1;
  for (let i = 0; i < words.length; i++) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    words[i] = x >>> 0;
  }
  for (let i = words.length * 4; i < length; i++) out[i] = (seed + i) & 0xff;
  return out;
}

function assertCode(e: unknown, code: string, what: string): void {
  assert.ok(isAirmError(e), `${what}: expected an @airm typed error with code ${code}, got ${String(e)}`);
  assert.equal((e as { code: string }).code, code, `${what}: wrong error code (${(e as Error).message})`);
}

async function expectCode(p: Promise<unknown>, code: string, what: string): Promise<void> {
  let threw = false;
  try {
    await p;
  } catch (e) {
    threw = true;
    assertCode(e, code, what);
  }
  assert.ok(threw, `${what}: expected ${code}, but it succeeded`);
}

/** Asserts a pulled blob holds exactly `want` and that a CRC-32 it reports is the bytes' own. */
function assertBlob(got: PulledBlob, want: Uint8Array, what: string): void {
  const b = got.bytes;
  assert.ok(b instanceof Uint8Array, `${what}: pull must resolve to {bytes: Uint8Array, crc32}`);
  assert.equal(b.byteLength, want.byteLength, `${what}: length`);
  assert.ok(Buffer.from(b.buffer, b.byteOffset, b.byteLength).equals(want), `${what}: bytes differ`);
  if (got.crc32 !== null) assert.equal(got.crc32, kvCrc32(b), `${what}: the reported crc32 is not the CRC-32 of the returned bytes`);
}

async function roundTrip(ctx: KVCaseContext, sizes: number[], tag: string): Promise<void> {
  const rid = ctx.rid(tag);
  const blobs = sizes.map((n, i) => patternBytes(i + 1 + n, n));
  for (let i = 0; i < sizes.length; i++) await ctx.producer.push(blobKey(rid, i, "k"), blobs[i]);
  for (let i = 0; i < sizes.length; i++) {
    assertBlob(await ctx.consumer.pull(blobKey(rid, i, "k"), { timeoutMs: 5000 }), blobs[i], `blob ${i} of ${sizes[i]} bytes`);
  }
  await ctx.consumer.release(rid);
  await ctx.producer.release(rid);
}

/** A request's KV in layout rngd-pd/v2 (random bytes, the positions past n zero) and its manifest. */
function pagedRequest(rid: string, g: KVGeometry, blockSize: number, n: number): { k: Uint8Array[]; v: Uint8Array[]; manifest: KVManifest } {
  const blocks = blocksFor(n, blockSize);
  const bb = blockLayerBytes(g, blockSize);
  const tail = n - (blocks - 1) * blockSize;
  const make = (seed: number, kind: "k" | "v"): Uint8Array => {
    const b = patternBytes(seed, blocks * bb);
    const last = b.subarray((blocks - 1) * bb);
    if (kind === "k") zeroBlockTailK(g, blockSize, tail, last);
    else zeroBlockTailV(g, blockSize, tail, last);
    return b;
  };
  const k = Array.from({ length: g.layers }, (_, l) => make(1000 + 2 * l, "k"));
  const v = Array.from({ length: g.layers }, (_, l) => make(1001 + 2 * l, "v"));
  const manifest: KVManifest = {
    layout: KV_LAYOUT,
    dtype: "bf16",
    blockSize,
    n,
    blocks,
    ...g,
    modelFingerprint: "conformance-model",
    numericsFingerprint: "conformance-numerics",
    requestId: rid,
    firstToken: 1,
    promptTokens: Array.from({ length: n }, (_, i) => i % 100),
    crc: { k: k.map(kvCrc32), v: v.map(kvCrc32) },
  };
  return { k, v, manifest };
}

/**
 * Pushes a paged request (layer blobs, then the manifest) and pulls it back as a decode side
 * does: manifest checked against `blockSize`, every blob against the manifest's size and CRC-32.
 */
async function pagedHandoff(ctx: KVCaseContext, tag: string, g: KVGeometry, blockSize: number, n: number, expectBlockSize = blockSize): Promise<void> {
  const rid = ctx.rid(tag);
  const req = pagedRequest(rid, g, blockSize, n);
  try {
    for (let l = 0; l < g.layers; l++) {
      await ctx.producer.push(blobKey(rid, l, "k"), req.k[l], { crc32: req.manifest.crc.k[l] });
      await ctx.producer.push(blobKey(rid, l, "v"), req.v[l], { crc32: req.manifest.crc.v[l] });
    }
    await ctx.producer.push(manifestKey(rid), encodeManifest(req.manifest));
    const got = decodeManifest((await ctx.consumer.pull(manifestKey(rid), { timeoutMs: 10_000 })).bytes, { layout: KV_LAYOUT, blockSize: expectBlockSize, ...g });
    assert.deepEqual(got, req.manifest, "the manifest crossed unchanged");
    const bb = blockLayerBytes(g, blockSize);
    for (let l = 0; l < g.layers; l++) {
      for (const kind of ["k", "v"] as const) {
        const blob = await ctx.consumer.pull(blobKey(rid, l, kind), { timeoutMs: 10_000 });
        verifyBlob(got, l, kind, blob);
        assertBlob(blob, kind === "k" ? req.k[l] : req.v[l], `layer ${l} ${kind}`);
        assert.equal(blob.bytes.byteLength, got.blocks * bb, `layer ${l} ${kind}: the request's ${got.blocks} blocks, no more`);
      }
    }
  } finally {
    await ctx.consumer.release(rid);
    await ctx.producer.release(rid);
  }
}

export const kvTransportCases: ConformanceCase<KVCaseContext>[] = [
  {
    id: "roundtrip-1b",
    title: "a 1-byte blob crosses byte-exact",
    run: (ctx) => roundTrip(ctx, [1], "one"),
  },
  {
    id: "roundtrip-odd-sizes",
    title: "odd sizes (3 B .. ~1 MB) cross byte-exact",
    run: (ctx) => roundTrip(ctx, [3, 4097, 65537, 999_999], "odd"),
  },
  {
    id: "roundtrip-1mib",
    title: "a 1 MiB blob crosses byte-exact",
    run: (ctx) => roundTrip(ctx, [1 << 20], "mib"),
  },
  {
    id: "request-64-blobs",
    title: "a 64-blob request (32 layers x K/V of 1 MiB) crosses byte-exact",
    async run(ctx) {
      const rid = ctx.rid("req64");
      const crcs: Buffer[] = [];
      for (let l = 0; l < 32; l++) {
        for (const kind of ["k", "v"] as const) {
          const b = patternBytes(l * 2 + (kind === "v" ? 1 : 0) + 77, 1 << 20);
          crcs.push(Buffer.from(b.subarray(0, 64)));
          await ctx.producer.push(blobKey(rid, l, kind), b);
        }
      }
      let i = 0;
      for (let l = 0; l < 32; l++) {
        for (const kind of ["k", "v"] as const) {
          const got = await ctx.consumer.pull(blobKey(rid, l, kind), { timeoutMs: 5000 });
          assertBlob(got, patternBytes(l * 2 + (kind === "v" ? 1 : 0) + 77, 1 << 20), `layer ${l} ${kind}`);
          assert.ok(crcs[i++].equals(Buffer.from(got.bytes.subarray(0, 64))), `layer ${l} ${kind} head bytes differ`);
        }
      }
      await ctx.consumer.release(rid);
      await ctx.producer.release(rid);
    },
  },
  {
    id: "pull-into-destination",
    title: "pull with `into` writes the caller's buffer and returns a view of it",
    async run(ctx) {
      const rid = ctx.rid("into");
      const data = patternBytes(5, 300_001);
      await ctx.producer.push(blobKey(rid, 0, "v"), data);
      const dest = new Uint8Array(400_000);
      const got = await ctx.consumer.pull(blobKey(rid, 0, "v"), { timeoutMs: 5000, into: dest });
      assertBlob(got, data, "pulled into a destination");
      assert.ok(got.bytes.buffer === dest.buffer, "result must be a view of the destination");
      assert.ok(Buffer.from(dest.subarray(0, data.byteLength)).equals(data), "destination bytes differ");
      await ctx.consumer.release(rid);
      await ctx.producer.release(rid);
    },
  },
  {
    id: "pull-waits-for-later-push",
    title: "a pull issued before the push waits for the blob and gets it",
    async run(ctx) {
      const rid = ctx.rid("later");
      const data = patternBytes(9, 70_000);
      const pulled = ctx.consumer.pull(blobKey(rid, 3, "k"), { timeoutMs: 10_000 });
      await new Promise((r) => setTimeout(r, 150));
      await ctx.producer.push(blobKey(rid, 3, "k"), data);
      assertBlob(await pulled, data, "late-pushed blob");
      await ctx.consumer.release(rid);
      await ctx.producer.release(rid);
    },
  },
  {
    id: "pull-missing-times-out",
    title: "a pull of a key never pushed fails with TRANSPORT_TIMEOUT after its timeout",
    async run(ctx) {
      const t0 = Date.now();
      await expectCode(ctx.consumer.pull(blobKey(ctx.rid("missing"), 0, "k"), { timeoutMs: 300 }), "TRANSPORT_TIMEOUT", "pull of a missing key");
      const waited = Date.now() - t0;
      assert.ok(waited >= 250, `gave up after ${waited} ms, before its 300 ms timeout`);
    },
  },
  {
    id: "release-frees",
    title: "after release a blob is gone (a pull times out) and the bytes are freed",
    async run(ctx) {
      const rid = ctx.rid("rel");
      await ctx.producer.push(blobKey(rid, 0, "k"), patternBytes(1, 65536));
      await ctx.producer.push(blobKey(rid, 0, "v"), patternBytes(2, 65536));
      const before = ctx.producer.stats?.();
      await ctx.consumer.pull(blobKey(rid, 0, "k"), { timeoutMs: 5000 });
      await ctx.consumer.release(rid);
      await ctx.producer.release(rid);
      await expectCode(ctx.consumer.pull(blobKey(rid, 0, "v"), { timeoutMs: 200 }), "TRANSPORT_TIMEOUT", "pull after release");
      const after = ctx.producer.stats?.();
      if (before && after) assert.ok(after.bytes <= before.bytes - 2 * 65536, `bytes held went ${before.bytes} -> ${after.bytes}`);
      await ctx.producer.release(rid); // idempotent
    },
  },
  {
    id: "concurrent-requests-do-not-mix",
    title: "8 requests pushed and pulled at once each get their own bytes",
    async run(ctx) {
      const rids = Array.from({ length: 8 }, (_, i) => ctx.rid(`c${i}`));
      const data = rids.map((_, i) => [patternBytes(100 + i, 200_000 + i), patternBytes(200 + i, 100_000 + 3 * i)]);
      await Promise.all(
        rids.map(async (rid, i) => {
          const pulls = [0, 1].map((l) => ctx.consumer.pull(blobKey(rid, l, "k"), { timeoutMs: 10_000 }));
          await ctx.producer.push(blobKey(rid, 0, "k"), data[i][0]);
          await ctx.producer.push(blobKey(rid, 1, "k"), data[i][1]);
          const got = await Promise.all(pulls);
          for (let l = 0; l < 2; l++) assertBlob(got[l], data[i][l], `request ${i} layer ${l}`);
        }),
      );
      for (const rid of rids) {
        await ctx.consumer.release(rid);
        await ctx.producer.release(rid);
      }
    },
  },
  {
    id: "bad-keys-rejected",
    title: "keys with '..', '/' abuse, NUL, empty or over-long names are rejected on push, pull and release",
    async run(ctx) {
      const bad = ["..", "a/../b", "/abs", "a//b", "a/", "a\0b", ".hidden", "x".repeat(400), "", "a b", "a\\b"];
      for (const key of bad) {
        await expectCode(ctx.producer.push(key, new Uint8Array(4)), "INVALID_KEY", `push ${JSON.stringify(key)}`);
        await expectCode(ctx.consumer.pull(key, { timeoutMs: 100 }), "INVALID_KEY", `pull ${JSON.stringify(key)}`);
      }
      for (const rid of ["..", "a/b", "", "a\0"]) await expectCode(ctx.producer.release(rid), "INVALID_KEY", `release ${JSON.stringify(rid)}`);
    },
  },
  {
    id: "wrong-dtype-or-layout-refused",
    title: "a dtype or layout the transport does not declare is refused with UNSUPPORTED",
    async run(ctx) {
      const key = blobKey(ctx.rid("dtype"), 0, "k");
      await expectCode(ctx.producer.push(key, new Uint8Array(8), { dtype: "fp32" as never }), "UNSUPPORTED", "push fp32");
      await expectCode(ctx.producer.push(key, new Uint8Array(8), { layout: "rngd-pd/v0" }), "UNSUPPORTED", "push layout v0");
      await expectCode(ctx.consumer.pull(key, { layout: "other", timeoutMs: 100 }), "UNSUPPORTED", "pull other layout");
    },
  },
  {
    id: "paged-partial-last-block",
    title:
      "a paged request (rngd-pd/v2) of 37 positions in blocks of 16 crosses as 3 blocks per blob, the last one's positions past n zero, each blob checked against the manifest",
    run: (ctx) => pagedHandoff(ctx, "partial", { layers: 4, kvHeads: 2, headDim: 64 }, 16, 37),
  },
  {
    id: "paged-long-prompt",
    title: "a 6,000-position paged request (375 blocks of 16 per blob, 8 layers) crosses byte-exact",
    run: (ctx) => pagedHandoff(ctx, "long", { layers: 8, kvHeads: 4, headDim: 64 }, 16, 6000),
  },
  {
    id: "paged-block-size-mismatch",
    title: "KV in blocks of 32 pulled by a side that uses blocks of 16 is refused by name (blockSize), not read",
    async run(ctx) {
      let err: unknown;
      try {
        await pagedHandoff(ctx, "bsize", { layers: 2, kvHeads: 2, headDim: 64 }, 32, 40, 16);
      } catch (e) {
        err = e;
      }
      assert.ok(err instanceof KVIntegrityError || isAirmError(err, "KV_INTEGRITY"), `expected a KV_INTEGRITY error, got ${String(err)}`);
      assert.equal((err as KVIntegrityError).field, "blockSize");
      assert.match((err as Error).message, /block size \(--block-size\)/);
    },
  },
  {
    id: "push-with-given-crc32",
    title: "a push that passes the blob's CRC-32 crosses byte-exact; a crc32 that is not a uint32 is refused",
    async run(ctx) {
      const rid = ctx.rid("crc");
      const data = patternBytes(77, 256 * 1024 + 3);
      const key = blobKey(rid, 0, "k");
      await ctx.producer.push(key, data, { crc32: kvCrc32(data) });
      assertBlob(await ctx.consumer.pull(key, { timeoutMs: 10_000 }), data, "the blob pushed with its crc32");
      for (const bad of [-1, 2 ** 32, 1.5, Number.NaN]) {
        await expectCode(ctx.producer.push(blobKey(rid, 1, "k"), data, { crc32: bad }), "TRANSPORT_ERROR", `push with crc32 ${bad}`);
      }
      await ctx.producer.release(rid);
    },
  },
];

/** Fresh random prefix per run so reruns and concurrent runs never collide. */
export function newRunPrefix(): string {
  return `cf-${Date.now().toString(36)}-${randomBytes(3).toString("hex")}`;
}
