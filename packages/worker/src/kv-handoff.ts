// The two ends of one request's KV handoff over a KVTransport. Prefill side: push each layer's
// K and V (the prompt's blocks, layout rngd-pd/v2) as the engine finishes it, then the manifest
// (block size, positions, CRC-32 per blob, fingerprints, first token). Decode side: pull the manifest and the layers in order while the other side still
// computes them (each pull waits for its blob: prefetch), check the manifest against this
// engine, verify each blob's CRC. Knows nothing about HTTP, leases or decoding.

import {
  blobBytes,
  blobKey,
  blocksFor,
  ContextOverflowError,
  encodeManifest,
  firstLiveBlock,
  decodeManifest,
  kvCrc32,
  KVIntegrityError,
  KV_LAYOUT,
  manifestKey,
  unionMs,
  verifyBlob,
  windowedBlob,
  type KVBlobs,
  type PulledBlob,
  type KVManifest,
  type KVTransport,
  type ModelInfo,
} from "@airm/rm-core";

/** The blob shape of a request of n positions: what its blobs leave out (a sliding-window layer's zero blocks, or the blocks decode holds; see windowedBlob). */
export interface PushShape {
  n: number;
  blockSize: number;
  blocks: number;
  kvHeads: number;
  headDim: number;
  dtype: "bf16";
  slidingWindow?: KVManifest["slidingWindow"];
  held?: KVManifest["held"];
}

/**
 * The shape of the KV of `n` positions of `model` in blocks of `blockSize`, with its
 * sliding-window statement, and the blocks the decode side holds (`held`, checked by the caller).
 */
export function pushShape(model: ModelInfo, n: number, blockSize: number, held?: KVManifest["held"]): PushShape {
  const w = model.slidingWindow;
  return {
    n,
    blockSize,
    blocks: blocksFor(n, blockSize),
    kvHeads: model.kvHeads,
    headDim: model.headDim,
    dtype: "bf16",
    ...(w ? { slidingWindow: { window: w.window, layers: [...w.layers], zeroBlocks: firstLiveBlock(n, w.window, blockSize) } } : {}),
    ...(held ? { held: { ...held } } : {}),
  };
}

/** Bytes that cross for a request of this shape: every layer's K and V blob (sliding-window layers without their zero blocks). */
export function pushedBytes(shape: PushShape, layers: number): number {
  let bytes = 0;
  for (let l = 0; l < layers; l++) bytes += 2 * blobBytes(shape, l);
  return bytes;
}

/** Collects one request's per-layer pushes and finishes with the manifest. */
export class KVPusher {
  private readonly pending: Promise<void>[] = [];
  private readonly crcK: number[] = [];
  private readonly crcV: number[] = [];
  private failure: unknown;

  constructor(
    private readonly transport: KVTransport,
    private readonly requestId: string,
    private readonly timeoutMs: number,
    /** True once the request ended elsewhere (released, expired): nothing more is pushed, and finish throws. */
    private readonly ended: () => boolean = () => false,
    /** The request's KV shape; with a sliding window, those layers' blobs cross without their zero blocks. */
    private readonly shape?: PushShape,
  ) {}

  /** The engine's onLayer: computes both CRCs now (for the manifest and the push), pushes in the background (errors surface in finish). */
  onLayer = (layer: number, fullK: Uint8Array, fullV: Uint8Array): void => {
    if (this.ended()) return;
    const [k, v] = this.shape ? [windowedBlob(this.shape, layer, fullK, "trim"), windowedBlob(this.shape, layer, fullV, "trim")] : [fullK, fullV];
    const crcK = (this.crcK[layer] = kvCrc32(k));
    const crcV = (this.crcV[layer] = kvCrc32(v));
    // The transport sends these CRCs instead of reading each blob once more for its own.
    const opts = { dtype: "bf16" as const, layout: KV_LAYOUT, timeoutMs: this.timeoutMs };
    const p = Promise.all([
      this.transport.push(blobKey(this.requestId, layer, "k"), k, { ...opts, crc32: crcK }),
      this.transport.push(blobKey(this.requestId, layer, "v"), v, { ...opts, crc32: crcV }),
    ]).then(
      () => undefined,
      (e) => {
        this.failure ??= e;
      },
    );
    this.pending.push(p);
  };

  /**
   * Waits for every layer push, then pushes the manifest. Returns its fields.
   * Throws the first push error (TransportError...) or KVIntegrityError when a layer never came.
   */
  /** Pushes what is left and the manifest: `firsts` is every choice's first token, `prompt` the prompt's ids. */
  async finish(model: ModelInfo, kv: KVBlobs, firsts: number[], prompt: number[], lora?: KVManifest["lora"]): Promise<KVManifest> {
    await Promise.all(this.pending);
    if (this.failure) throw this.failure;
    if (this.ended()) throw new Error(`request ${this.requestId} ended while its KV was being pushed`);
    const shape = this.shape ?? pushShape(model, kv.n, kv.blockSize);
    if (shape.n !== kv.n || shape.blockSize !== kv.blockSize) {
      throw new KVIntegrityError("n", `the KV holds ${kv.n} positions in blocks of ${kv.blockSize}; its pushes were shaped for ${shape.n} in blocks of ${shape.blockSize}`);
    }
    for (let l = 0; l < model.layers; l++) {
      // An engine that did not call onLayer for some layer: push it now from the result.
      if (this.crcK[l] === undefined) this.onLayer(l, kv.k[l], kv.v[l]);
    }
    await Promise.all(this.pending);
    if (this.failure) throw this.failure;
    const manifest: KVManifest = {
      layout: KV_LAYOUT,
      dtype: "bf16",
      blockSize: kv.blockSize,
      n: kv.n,
      blocks: blocksFor(kv.n, kv.blockSize),
      layers: model.layers,
      kvHeads: model.kvHeads,
      headDim: model.headDim,
      modelFingerprint: model.modelFingerprint,
      numericsFingerprint: model.numericsFingerprint,
      requestId: this.requestId,
      firstToken: firsts[0],
      ...(firsts.length > 1 ? { firstTokens: firsts } : {}),
      promptTokens: prompt,
      crc: { k: this.crcK.slice(0, model.layers), v: this.crcV.slice(0, model.layers) },
      ...(shape.slidingWindow ? { slidingWindow: shape.slidingWindow } : {}),
      ...(shape.held ? { held: shape.held } : {}),
      ...(lora ? { lora } : {}),
    };
    await this.transport.push(manifestKey(this.requestId), encodeManifest(manifest), { timeoutMs: this.timeoutMs });
    return manifest;
  }
}

/**
 * The blob copied into this process's own memory. A pull may be a view of the producer's memory
 * (shm maps its slab), which stays the request's only while the producer's lease lasts
 * (PulledBlob.bytes). The decode worker keeps the KV while it waits for blocks, which can outlast
 * that lease (its TTL, under a burst of requests): the producer then frees the region and another
 * request's push reuses it, and the import read that request's KV (200 with wrong tokens, found by
 * test/e2e/peer-failures.test.ts, vLLM #53095). Copied first and checked after, no byte the
 * producer can still change is used.
 */
function owned(b: PulledBlob): PulledBlob {
  return { ...b, bytes: b.bytes.slice() };
}

export interface PulledKV {
  manifest: KVManifest;
  kv: KVBlobs;
  /** When the manifest and every blob had arrived (performance.now()). */
  arrivedAt: number;
  /** The layers' bytes and how long they were moving (the union of the blobs' transfer intervals), when the transport timed every blob. */
  transfer?: { bytes: number; movingMs: number };
}

/** What the pulling side's engine takes: its block size and max_model_len. */
export interface KVExpectation {
  blockSize: number;
  maxModelLen: number;
  /** The LoRA adapter the request decodes with (null: the base model; undefined: not checked). */
  lora?: { name: string; fingerprint: string } | null;
}

/**
 * Pulls one request's manifest and, alongside, its layers in order (each pull waits up to
 * `timeoutMs`), validates the manifest against this engine (layout, dtype, shape, block size,
 * fingerprints) and every blob's CRC-32 on a copy of its own (the transport's may then be released
 * at once). With `manifestOnly` only the manifest is pulled and checked. Throws
 * KVIntegrityError(field) on any mismatch, ContextOverflowError for positions past max_model_len,
 * TransportTimeoutError / TransportError from pulls.
 */
export async function pullKV(transport: KVTransport, requestId: string, model: ModelInfo, kvs: KVExpectation, timeoutMs: number, manifestOnly = false): Promise<PulledKV> {
  const opts = { dtype: "bf16" as const, layout: KV_LAYOUT, timeoutMs };
  const manifestP = transport.pull(manifestKey(requestId), { timeoutMs }).then(({ bytes }) => {
    const m = decodeManifest(bytes, {
      layout: KV_LAYOUT,
      dtype: "bf16",
      layers: model.layers,
      kvHeads: model.kvHeads,
      headDim: model.headDim,
      modelFingerprint: model.modelFingerprint,
      numericsFingerprint: model.numericsFingerprint,
      blockSize: kvs.blockSize,
      slidingWindow: model.slidingWindow ?? null,
      lora: kvs.lora,
    });
    // A prompt longer than this side's max_model_len is the request's fault, not the KV's: the 400
    // context_overflow prefill gives, not a 502 kv_integrity_error (the gateway checks max_tokens
    // against the smallest max_model_len; a prefill worker may serve a longer context than decode).
    if (m.n > kvs.maxModelLen) throw new ContextOverflowError(m.n + 1, kvs.maxModelLen, `the prompt alone has ${m.n} tokens on the decode worker`);
    if (m.requestId !== requestId) throw new KVIntegrityError("requestId", `KV manifest is for ${m.requestId}, not ${requestId}`);
    const isId = (t: unknown) => Number.isInteger(t) && (t as number) >= 0 && (t as number) < model.vocabSize;
    if (!isId(m.firstToken)) throw new KVIntegrityError("firstToken", `KV manifest firstToken ${JSON.stringify(m.firstToken)} is not a token id of this model`);
    if (m.firstTokens !== undefined && !(Array.isArray(m.firstTokens) && m.firstTokens.every(isId) && m.firstTokens[0] === m.firstToken)) {
      throw new KVIntegrityError("firstTokens", "KV manifest firstTokens are not token ids of this model starting with firstToken");
    }
    // The prompt's ids: what the penalties read, and what a stream preempted here is recomputed from.
    if (!(Array.isArray(m.promptTokens) && m.promptTokens.length === m.n && m.promptTokens.every(isId))) {
      throw new KVIntegrityError("promptTokens", `KV manifest promptTokens must be the ${m.n} token ids of the prompt`);
    }
    return m;
  });
  if (manifestOnly) {
    const manifest = await manifestP;
    return { manifest, kv: { blockSize: manifest.blockSize, n: manifest.n, k: [], v: [] }, arrivedAt: performance.now() };
  }
  // Layers arrive in order, so pulling them in order costs no latency, and only the manifest
  // and one layer wait at a time (a transport that polls while waiting then polls 3 keys, not
  // 2 x layers + 1, beside a prefill that needs the CPU).
  const pullLayers = async (): Promise<[PulledBlob, PulledBlob][]> => {
    const out: [PulledBlob, PulledBlob][] = [];
    for (let l = 0; l < model.layers; l++) {
      out.push(await Promise.all([transport.pull(blobKey(requestId, l, "k"), opts), transport.pull(blobKey(requestId, l, "v"), opts)]));
    }
    return out;
  };
  // A bad manifest fails the request at once, even while a layer pull still waits (the lease end
  // releases the request, which frees it).
  const layersP = pullLayers();
  layersP.catch(() => {});
  const [manifest, pairs] = await Promise.all([manifestP, layersP]);
  const arrivedAt = performance.now();
  const k: Uint8Array[] = [];
  const v: Uint8Array[] = [];
  const blobs = pairs.flat();
  const timed = blobs.every((b) => b.transfer !== undefined);
  const transfer = timed ? { bytes: blobs.reduce((a, b) => a + b.bytes.byteLength, 0), movingMs: unionMs(blobs.map((b) => b.transfer!)) } : undefined;
  pairs.forEach(([kb, vb], l) => {
    const [ko, vo] = [owned(kb), owned(vb)];
    verifyBlob(manifest, l, "k", ko);
    verifyBlob(manifest, l, "v", vo);
    // a sliding-window layer's blob crossed without its zero blocks: the engine takes every block
    k.push(windowedBlob(manifest, l, ko.bytes, "widen"));
    v.push(windowedBlob(manifest, l, vo.bytes, "widen"));
  });
  // blocks the decode side holds did not cross: the engine adopts its own
  const from = (manifest.held?.blocks ?? 0) * manifest.blockSize;
  return { manifest, kv: { blockSize: manifest.blockSize, n: manifest.n, ...(from ? { from } : {}), k, v }, arrivedAt, ...(transfer ? { transfer } : {}) };
}
