// The I/O contract of an ATOM decode graph compiled for (B, S), driven through the RBLN runtime
// binding: the whole KV cache is a host input on every step and the graph returns the logits and
// the K/V of the new position, which the engine writes back into its host cache. The engine keeps
// that cache in blocks (layout rngd-pd/v2) and gathers a stream's positions into the graph's
// dense S-wide input each step (S: the smallest compiled context that holds them); the new
// position goes back into the stream's block (writeBlockColumn). The graph file is produced on
// the host beforehand (the compile step is not part of this package).
//
//   in[0]      token ids      int32 [B]
//   in[1]      positions      int32 [B]             (the position each token is written at)
//   in[2+2l]   K of layer l   bf16  [B, kv_heads, head_dim, S]
//   in[3+2l]   V of layer l   bf16  [B, kv_heads, S, head_dim]
//   out[0]     logits         f32   [B, vocab]
//   out[1+2l]  new K, layer l bf16  [B, kv_heads, head_dim]
//   out[2+2l]  new V, layer l bf16  [B, kv_heads, head_dim]
//
// Rows past the number of live streams are zero and their outputs ignored.

import { existsSync } from "node:fs";
import { join } from "node:path";
import type { EngineVariant } from "@airm/rm-core";
import { NativeRuntimeError, denseLayerBytes, variantName, type DecodeGraphShape, type DenseKV, type HostDecodeResult } from "@airm/engine-kit";
import { RblnGraphSession, type RblnRuntimeLibrary } from "./rbln-runtime.ts";

/** The graph file for a variant inside a graph folder: `decode-B4xS512.rbln`. */
export function decodeGraphFile(dir: string, v: EngineVariant): string {
  return join(dir, `decode-${variantName(v)}.rbln`);
}

/** Byte sizes the contract expects, inputs then outputs. */
export function decodeGraphIO(shape: DecodeGraphShape, v: EngineVariant): { inputs: number[]; outputs: number[] } {
  const B = v.batch;
  const inputs = [4 * B, 4 * B];
  const outputs = [4 * B * shape.vocabSize];
  const column = B * shape.kvHeads * shape.headDim * 2;
  for (let l = 0; l < shape.layers; l++) {
    inputs.push(B * denseLayerBytes(shape, v.seqLen), B * denseLayerBytes(shape, v.seqLen));
    outputs.push(column, column);
  }
  return { inputs, outputs };
}

/** A decode graph opened on one ATOM card. */
export class RblnDecodeGraph {
  readonly variant: EngineVariant;
  readonly file: string;
  private readonly shape: DecodeGraphShape;
  private readonly session: RblnGraphSession;

  /**
   * Opens `file` on device `deviceId` and checks every input and output size against the
   * contract for `shape` and `variant`. Throws NativeRuntimeError naming the first mismatch
   * (a graph compiled for another model, batch or S).
   */
  constructor(lib: RblnRuntimeLibrary, file: string, deviceId: number, shape: DecodeGraphShape, variant: EngineVariant) {
    if (!existsSync(file)) {
      throw new NativeRuntimeError("decode graph", `${file} does not exist; compile the ${variantName(variant)} decode graph on the host first`);
    }
    this.file = file;
    this.variant = variant;
    this.shape = shape;
    this.session = new RblnGraphSession(lib, file, deviceId);
    const want = decodeGraphIO(shape, variant);
    const check = (what: "input" | "output", got: number[], exp: number[]): void => {
      if (got.length !== exp.length) {
        this.session.close();
        throw new NativeRuntimeError("decode graph", `${file} has ${got.length} ${what}s, the ${variantName(variant)} contract needs ${exp.length}`);
      }
      const i = got.findIndex((n, j) => n !== exp[j]);
      if (i >= 0) {
        this.session.close();
        throw new NativeRuntimeError("decode graph", `${file}: ${what} ${i} is ${got[i]} bytes, the contract needs ${exp[i]} (compiled for another model or variant?)`);
      }
    };
    check("input", this.session.inputBytes, want.inputs);
    check("output", this.session.outputBytes, want.outputs);
  }

  /** One step for up to B streams: `host[i]` is stream i's whole cache, `tokens[i]` its token. */
  step(host: DenseKV[], tokens: number[]): HostDecodeResult[] {
    const { batch: B, seqLen: S } = this.variant;
    const g = this.shape;
    if (host.length === 0 || host.length > B || tokens.length !== host.length) {
      throw new NativeRuntimeError("decode graph", `step takes 1..${B} streams with one token each, got ${host.length} / ${tokens.length}`);
    }
    const ids = new Int32Array(B);
    const pos = new Int32Array(B);
    host.forEach((h, i) => {
      if (h.seqLen !== S) throw new NativeRuntimeError("decode graph", `stream ${i} has S=${h.seqLen}, graph ${variantName(this.variant)}`);
      ids[i] = tokens[i];
      pos[i] = h.n;
    });
    this.session.setInput(0, new Uint8Array(ids.buffer));
    this.session.setInput(1, new Uint8Array(pos.buffer));
    const lb = denseLayerBytes(g, S);
    const staging = new Uint8Array(B * lb);
    for (let l = 0; l < g.layers; l++) {
      staging.fill(0);
      for (const [i, h] of host.entries()) staging.set(h.k[l], i * lb);
      this.session.setInput(2 + 2 * l, staging);
      staging.fill(0);
      for (const [i, h] of host.entries()) staging.set(h.v[l], i * lb);
      this.session.setInput(3 + 2 * l, staging);
    }
    this.session.run();
    const logitsAll = this.session.output(0);
    const col = g.kvHeads * g.headDim * 2;
    const ks = Array.from({ length: g.layers }, (_, l) => this.session.output(1 + 2 * l));
    const vs = Array.from({ length: g.layers }, (_, l) => this.session.output(2 + 2 * l));
    return host.map((_, i) => ({
      logits: new Float32Array(logitsAll.buffer.slice(i * 4 * g.vocabSize, (i + 1) * 4 * g.vocabSize)),
      k: ks.map((x) => x.slice(i * col, (i + 1) * col)),
      v: vs.map((x) => x.slice(i * col, (i + 1) * col)),
    }));
  }

  close(): void {
    this.session.close();
  }
}
