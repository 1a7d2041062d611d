// The KV manifest: what a prefill side promises about the blobs of one request, and the checks a
// decode side runs before it trusts them (layout, shape, model and numerics fingerprints,
// CRC-32 per blob). Every mismatch is a KVIntegrityError that names the field.

import { crc32 } from "@node-rs/crc32";
import { KVIntegrityError } from "./errors.ts";
import type { PulledBlob } from "./contracts.ts";
import { BLOCK_SIZES, KV_LAYOUT, blockLayerBytes, blocksFor, firstLiveBlock, type KVDtype } from "./kv-layout.ts";
import { blobKey, validateRequestId } from "./kv-key.ts";

export interface KVManifest {
  layout: typeof KV_LAYOUT;
  dtype: KVDtype;
  /** Positions per block (every blob holds whole blocks). */
  blockSize: number;
  /** Valid positions [0, n). */
  n: number;
  /** Blocks per blob: ceil(n / blockSize). */
  blocks: number;
  layers: number;
  kvHeads: number;
  headDim: number;
  modelFingerprint: string;
  numericsFingerprint: string;
  requestId: string;
  firstToken?: number;
  /** The first token of every choice when the request has several (`firstToken` is choice 0's). */
  firstTokens?: number[];
  /** The prompt's token ids (n of them): what decode's penalties and a continuation elsewhere read. */
  promptTokens?: number[];
  /** CRC-32 of each blob, `k[layer]` and `v[layer]`. */
  crc: { k: number[]; v: number[] };
  /**
   * Sliding-window layers: `layers` attend only to the last `window` positions, so no query from
   * n on reads their blocks [0, zeroBlocks) (= firstLiveBlock(n, window, blockSize)). Their blobs
   * hold only blocks [zeroBlocks, blocks): the rest is zero and does not cross, and the decode
   * side takes no memory for it. Absent when no layer slides.
   */
  slidingWindow?: { window: number; layers: number[]; zeroBlocks: number };
  /**
   * The decode side already holds blocks [0, held.blocks) of this request (its prefix cache), so
   * no blob carries them: every blob holds blocks [held.blocks, blocks). `hash` is the block hash
   * (rm-core block-hash.ts, the request's cache_salt) of block held.blocks - 1 as the prefill side
   * computed it from the prompt: the decode side takes its blocks only under that name. At least
   * one position crosses (held.blocks * blockSize < n). Not with a sliding window.
   */
  held?: { blocks: number; hash: string };
  /** The LoRA adapter the KV was computed with (its name and fingerprint); absent: the base model. */
  lora?: { name: string; fingerprint: string };
}

/** The sliding window a receiver's model has (null: none); compared with the manifest's. */
export type WindowExpectation = { window: number; layers: number[] } | null;

/** What the receiving side expects; any field left out is not checked. */
export type ManifestExpectation = Partial<Pick<KVManifest, "layout" | "dtype" | "blockSize" | "layers" | "kvHeads" | "headDim" | "modelFingerprint" | "numericsFingerprint">> & {
  maxN?: number;
  slidingWindow?: WindowExpectation;
  /** The adapter this side decodes with: its name and fingerprint, or null for the base model (undefined: not checked). */
  lora?: { name: string; fingerprint: string } | null;
};

/** Checks that the KV was computed with the adapter (or the base model) this side continues with. */
function checkLora(m: KVManifest, want: { name: string; fingerprint: string } | null | undefined): void {
  if (want === undefined) return;
  const got = m.lora;
  if ((got?.fingerprint ?? null) === (want?.fingerprint ?? null)) return;
  const say = (x: { name: string; fingerprint: string } | null | undefined) =>
    x ? `LoRA adapter ${JSON.stringify(x.name)} (${x.fingerprint.slice(0, 12)})` : "the base model (no adapter)";
  throw new KVIntegrityError("lora", `the KV was computed with ${say(got)}, but this request decodes with ${say(want)}: prefill and decode must run the same adapter`);
}

/** Checks a manifest's sliding-window statement against its own n and block size, and against `want` (undefined: not checked). */
function checkWindow(m: KVManifest, want: WindowExpectation | undefined): void {
  const w = m.slidingWindow;
  if (w !== undefined) {
    const okLayers = Array.isArray(w.layers) && w.layers.every((l, i) => Number.isInteger(l) && l >= 0 && l < m.layers && (i === 0 || l > w.layers[i - 1]));
    if (!isPosInt(w.window) || !okLayers || w.layers.length === 0) {
      throw new KVIntegrityError("slidingWindow", `manifest slidingWindow needs a window >= 1 and ascending layer indices in [0, ${m.layers}), got ${JSON.stringify(w)}`);
    }
    const zero = firstLiveBlock(m.n, w.window, m.blockSize);
    if (w.zeroBlocks !== zero) {
      throw new KVIntegrityError(
        "slidingWindow",
        `manifest slidingWindow.zeroBlocks=${JSON.stringify(w.zeroBlocks)}, but a window of ${w.window} at n=${m.n} leaves ${zero} blocks`,
      );
    }
  }
  if (want === undefined) return;
  const same = want === null ? w === undefined : w !== undefined && w.window === want.window && w.layers.join(",") === want.layers.join(",");
  if (!same) {
    const say = (x: { window: number; layers: number[] } | null | undefined) => (x ? `a window of ${x.window} on layers ${x.layers.join(",")}` : "no sliding window");
    throw new KVIntegrityError("slidingWindow", `KV manifest says ${say(w)}, this side's model has ${say(want)}: prefill and decode must run the same model`);
  }
}

type BlobShape = Pick<KVManifest, "kvHeads" | "headDim" | "blockSize" | "blocks" | "dtype" | "slidingWindow" | "held">;

/**
 * The leading blocks of a layer's blob that do not cross: a sliding-window layer's zero blocks,
 * or the blocks the decode side holds (`held`). Without `layer`: none.
 */
export function skippedBlocks(m: BlobShape, layer?: number): number {
  if (layer === undefined) return 0;
  if (m.slidingWindow?.layers.includes(layer)) return m.slidingWindow.zeroBlocks;
  return m.held?.blocks ?? 0;
}

/**
 * Bytes of one blob of the manifest's request: its blocks of one layer's K or V from
 * skippedBlocks on (without `layer`, every block).
 */
export function blobBytes(m: BlobShape, layer?: number): number {
  return (m.blocks - skippedBlocks(m, layer)) * blockLayerBytes(m, m.blockSize, m.dtype);
}

/**
 * A layer's blob as it crosses (`trim`: the blocks from skippedBlocks on), or a sliding-window
 * layer's as the engine takes it (`widen`: zeros in front again; held blocks are not widened,
 * the engine adopts its own). Other blobs pass unchanged.
 */
export function windowedBlob(m: BlobShape, layer: number, blob: Uint8Array, how: "trim" | "widen"): Uint8Array {
  const skipped = skippedBlocks(m, layer);
  if (skipped === 0) return blob;
  const skip = skipped * blockLayerBytes(m, m.blockSize, m.dtype);
  if (how === "trim") return blob.subarray(skip);
  if (!m.slidingWindow?.layers.includes(layer)) return blob;
  const out = new Uint8Array(skip + blob.byteLength);
  out.set(blob, skip);
  return out;
}

/** Checks a manifest's `held` statement: whole blocks short of n, a block hash, no sliding window. */
function checkHeld(m: KVManifest): void {
  const h = m.held;
  if (h === undefined) return;
  if (!isPosInt(h.blocks) || h.blocks * m.blockSize >= m.n || typeof h.hash !== "string" || !/^[0-9a-f]{64}$/.test(h.hash)) {
    throw new KVIntegrityError("held", `manifest held needs 1 <= blocks < n / blockSize (${m.n} / ${m.blockSize}) and a 64-hex block hash, got ${JSON.stringify(h)}`);
  }
  if (m.slidingWindow) throw new KVIntegrityError("held", "manifest held cannot go with a sliding window (every layer's blocks must be held)");
}

export function kvCrc32(data: Uint8Array): number {
  return crc32(data) >>> 0;
}

function isPosInt(x: unknown): x is number {
  return typeof x === "number" && Number.isInteger(x) && x > 0;
}

/** Checks a manifest's own consistency, then each expected field. Throws KVIntegrityError(field). */
export function validateManifest(input: unknown, expect: ManifestExpectation = {}): KVManifest {
  if (typeof input !== "object" || input === null) throw new KVIntegrityError("manifest", "KV manifest is not an object");
  const m = input as KVManifest;
  if (m.layout !== KV_LAYOUT) {
    throw new KVIntegrityError("layout", `KV layout ${JSON.stringify(m.layout)} is not ${KV_LAYOUT}`);
  }
  if (m.dtype !== "bf16" && m.dtype !== "fp16") throw new KVIntegrityError("dtype", `KV dtype ${JSON.stringify(m.dtype)} is not bf16 or fp16`);
  for (const f of ["blockSize", "blocks", "layers", "kvHeads", "headDim"] as const) {
    if (!isPosInt(m[f])) throw new KVIntegrityError(f, `manifest field ${f} must be a positive integer, got ${JSON.stringify(m[f])}`);
  }
  if (!(BLOCK_SIZES as readonly number[]).includes(m.blockSize)) {
    throw new KVIntegrityError("blockSize", `manifest blockSize ${m.blockSize} is not one of ${BLOCK_SIZES.join(", ")}`);
  }
  if (!Number.isInteger(m.n) || m.n < 1) throw new KVIntegrityError("n", `manifest n=${JSON.stringify(m.n)} must be an integer >= 1`);
  if (m.blocks !== blocksFor(m.n, m.blockSize)) {
    throw new KVIntegrityError("blocks", `manifest blocks=${m.blocks} does not hold n=${m.n} positions in blocks of ${m.blockSize} (${blocksFor(m.n, m.blockSize)})`);
  }
  try {
    validateRequestId(m.requestId);
  } catch (e) {
    throw new KVIntegrityError("requestId", `manifest requestId: ${(e as Error).message}`);
  }
  for (const f of ["modelFingerprint", "numericsFingerprint"] as const) {
    if (typeof m[f] !== "string" || m[f].length === 0) throw new KVIntegrityError(f, `manifest field ${f} is missing`);
  }
  if (!m.crc || !Array.isArray(m.crc.k) || !Array.isArray(m.crc.v) || m.crc.k.length !== m.layers || m.crc.v.length !== m.layers) {
    throw new KVIntegrityError("crc", `manifest must carry ${m.layers} K and ${m.layers} V CRC-32 values`);
  }
  checkWindow(m, expect.slidingWindow);
  checkHeld(m);
  checkLora(m, expect.lora);
  for (const [field, want] of Object.entries(expect) as [keyof ManifestExpectation, unknown][]) {
    if (want === undefined || field === "slidingWindow" || field === "lora") continue;
    if (field === "maxN") {
      if (m.n > (want as number)) throw new KVIntegrityError("n", `manifest n=${m.n} exceeds what this side accepts (${want as number})`);
      continue;
    }
    const got = m[field as keyof KVManifest];
    if (got !== want) {
      const what = field === "blockSize" ? "KV block size (--block-size)" : "model, layout and numerics";
      throw new KVIntegrityError(
        field,
        `KV manifest ${field} is ${JSON.stringify(got)} but this side expects ${JSON.stringify(want)}: prefill and decode must run the same ${what}`,
      );
    }
  }
  return m;
}

/**
 * Throws KVIntegrityError("crc") unless the blob's length and CRC-32 match the manifest. A pulled
 * blob whose transport measured its CRC-32 on arrival is compared by that value; otherwise (and
 * for plain arrays) the CRC is computed here.
 */
export function verifyBlob(m: KVManifest, layer: number, kind: "k" | "v", blob: PulledBlob | Uint8Array): void {
  const data = blob instanceof Uint8Array ? blob : blob.bytes;
  const measured = blob instanceof Uint8Array ? null : blob.crc32;
  const want = blobBytes(m, layer);
  if (data.byteLength !== want) {
    throw new KVIntegrityError("bytes", `KV blob ${blobKey(m.requestId, layer, kind)} has ${data.byteLength} bytes, expected ${want}`);
  }
  const got = measured ?? kvCrc32(data);
  const crc = m.crc[kind][layer];
  if (got !== crc) {
    throw new KVIntegrityError(
      "crc",
      `KV blob ${blobKey(m.requestId, layer, kind)} failed its CRC-32 check (got ${got.toString(16)}, manifest ${(crc >>> 0).toString(16)}): the bytes were corrupted in transit`,
    );
  }
}

export function encodeManifest(m: KVManifest): Uint8Array {
  return new TextEncoder().encode(JSON.stringify(m));
}

export function decodeManifest(bytes: Uint8Array, expect?: ManifestExpectation): KVManifest {
  let parsed: unknown;
  try {
    parsed = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(bytes));
  } catch (e) {
    throw new KVIntegrityError("manifest", `KV manifest is not valid JSON: ${(e as Error).message}`);
  }
  return validateManifest(parsed, expect);
}
