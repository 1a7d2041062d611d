// Assembles wat/kernels.wat into wasm bytes with wabt (pure wasm, no native toolchain) once per
// process, at first use. Knows where the WAT lives and its digest; knows nothing of the model.
import { createHash } from "node:crypto";
import { existsSync, readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import wabtInit from "wabt";
import { AirmError } from "@airm/rm-core";
import { wasmApi, type WasmModule } from "./wasm-api.ts";

/** Bump when a numerics choice outside the WAT changes (JS-side softmax, SiLU, RoPE tables, ...). */
export const KERNEL_VERSION = "rngd-pd-cpu-kernels/2";

/** The numerics choices folded into the model's numerics fingerprint (besides the WAT text). */
export const NUMERICS_CHOICES = [
  "weights=bf16,widen=exact,simd=wasm128,relaxed=no",
  "dot=acc4(even,odd per 8 cols),hsum=(0+1)+(2+3)",
  "kv=bf16-rne,attention-reads-cache=always",
  "exp=wasm f32x4 polynomial (clamp [-87,88], 2^k * cephes p(r)), no FMA",
  "softmax=f32 z=x*scale, exp(z-max), sum=sequential f32, *(1/sum)",
  "silu=g/(1+exp(-g)) f32, times up",
  "geglu=g/(1+exp(-(g*(c1+c2*(g*g))))) f32 (gelu tanh form, c1=f32(2sqrt(2/pi)), c2=f32(c1*0.044715)), times up",
  "sliding window=query at n-1 reads [max(0,n-W),n), softmax over it, values summed from its start",
  "rope=f64 cos/sin of f32 angle rounded to f32,rotate_half",
  "rmsnorm=(x*inv)*w,inv=1/sqrt(ss/n+eps) f32",
  "split=rows|heads only",
  "quantized=GGUF Q8_0/Q4_0(as m=-8d)/Q4_1 blocks in 4-row groups, x as i16 per 32-block (d=amax/32767, nearest-even), isum exact i32, acc+=f32(isum)*(dw*dx) then +=m*sx, blocks in order",
  "a8=Q4_0/Q4_1/Q4_K/Q6_K blocks in 4-row lanes over x as i8 per 32-block (d=amax/127, nearest-even, clamp 127), relaxed i16 dot with unsigned weights (nibbles, q6 0..63: exact), isum exact i32 (q6: minus 32*sum x per 16 cols), acc+=f32(isum)*(dw*dx) then +=m*sx (q6: lo half then hi half)",
  "lora=per token u=A x (f32, 4 lanes over cols, hsum), y+=f32(dot(B[o],u))*f32(scale) after the base matmul and its bias, before any norm; calling thread only",
  "q5a8=Q5_0(m=-16d)/Q5_1/Q5_K q 0..31 in q6ka8's byte order, isum exact i32 over both halves, acc+=f32(isum)*(dw*dx) then +=m*sx; Q3_K as q6k/q6ka8 (q-32 range), IQ4_NL/IQ4_XS as q8 (int8 levels, d per 32)",
].join(";");

function watPath(): string {
  // Source layout (src/kernels/assemble.ts) and bundled layout (dist/index.js) both find ../wat.
  const candidates = ["../../wat/kernels.wat", "../wat/kernels.wat"].map((rel) => fileURLToPath(new URL(rel, import.meta.url)));
  const found = candidates.find((p) => existsSync(p));
  if (!found) throw new AirmError("MODEL_LOAD", `kernel source not found at ${candidates.join(" or ")}; reinstall @airm/llama`);
  return found;
}

export interface AssembledKernels {
  wasm: Uint8Array;
  module: WasmModule;
  /** sha-256 hex of the WAT text. */
  sourceSha256: string;
}

/**
 * The WAT with `weightMemories` more imported memories (`env.weights1` ...) and, for each, a copy of
 * the matmul kernels and stream_read (every function that takes a weight matrix `$w`, except
 * rmsnorm, whose weights stay in the main memory) whose weight loads (through `$w` or a local
 * named `$w_...`) read that memory: exported
 * as `matmul_q4_w1`, `stream_read_w1` and so on. The copies differ from the originals only in the memory index of the
 * loads through `$w`, so they do the same arithmetic in the same order (same bits).
 */
export function withWeightMemories(text: string, weightMemories: number): string {
  if (weightMemories === 0) return text;
  const anchor = '(import "env" "memory" (memory 1 65536 shared))';
  if (!text.includes(anchor)) throw new AirmError("MODEL_LOAD", "kernels.wat: the main memory import is not where the weight memories go");
  const moduleEnd = text.lastIndexOf(")");
  const parts = text
    .slice(0, moduleEnd)
    .trimEnd()
    .split(/\n(?= {2}\(func )/);
  const isWeightKernel = (f: string): boolean => f.includes("(param $w i32)") && !/\(export "(?!matmul|stream_read)/.test(f.slice(0, f.indexOf("(param")));
  const kernels = parts.slice(1).filter(isWeightKernel);
  const names = kernels.map((f) => /^ {2}\(func (\$[\w.]+)/.exec(f)?.[1]).filter((n): n is string => n !== undefined);
  const copies: string[] = [];
  for (let m = 1; m <= weightMemories; m++) {
    for (const f of kernels) {
      let c = f.replace(/\(export "((?:matmul|stream_read)\w*)"\)/, `(export "$1_w${m}")`);
      for (const n of names) c = c.replaceAll(`(func ${n} `, `(func ${n}.w${m} `).replaceAll(`(call ${n} `, `(call ${n}.w${m} `);
      const loads = c.match(/\.load/g)?.length ?? 0;
      let moved = 0;
      // Weight pointers are $w and locals named $w_... (a second pointer into the same image).
      c = c.replace(/\((\w+\.load\w*)((?: offset=\d+)?(?: align=\d+)?) \(local\.get (\$w(?:_\w+)?)\)\)/g, (_all, op: string, memarg: string, ptr: string) => {
        moved++;
        return `(${op} $weights${m}${memarg} (local.get ${ptr}))`;
      });
      const direct = c.match(/\.load\w*(?: \$\w+)?(?: offset=\d+)?(?: align=\d+)? \(local\.get \$\w+\)\)/g)?.length ?? 0;
      // Every load must be a direct one (through a local), so none can read the weights through another expression.
      if (direct !== loads) throw new AirmError("MODEL_LOAD", `kernels.wat: a load in a weight kernel does not address a local directly; weight memories cannot be generated`);
      if (moved === 0 && !c.includes("(call ")) throw new AirmError("MODEL_LOAD", "kernels.wat: a weight kernel reads no weights");
      copies.push(c.trimEnd());
    }
  }
  const imports = Array.from({ length: weightMemories }, (_, i) => `\n  (import "env" "weights${i + 1}" (memory $weights${i + 1} 0 65536 shared))`).join("");
  const head = parts[0].replace(anchor, anchor + imports);
  const body = [head, ...parts.slice(1), ...copies].join("\n\n");
  return `${body})\n`;
}

const assembled = new Map<number, Promise<AssembledKernels>>();

/**
 * Assembles (once per process and weight-memory count) and compiles the kernel module. Throws
 * AirmError MODEL_LOAD when the WAT is missing or invalid.
 */
export function assembleKernels(weightMemories = 0): Promise<AssembledKernels> {
  let p = assembled.get(weightMemories);
  if (p) return p;
  p = (async () => {
    const path = watPath();
    const source = readFileSync(path, "utf8");
    const text = withWeightMemories(source, weightMemories);
    const wabt = await wabtInit();
    // multi_memory is a wabt feature its type declarations leave out.
    const features = { simd: true, relaxed_simd: true, threads: true, multi_memory: weightMemories > 0 } as Parameters<typeof wabt.parseWat>[2];
    const parsed = wabt.parseWat(path, text, features);
    try {
      parsed.resolveNames();
      // WebAssembly.compile validates; wabt's own validator rejects shared memory imports.
      const wasm = parsed.toBinary({}).buffer.slice();
      const module = await wasmApi.compile(wasm);
      // The digest is the source's: the copies for weight memories do the same arithmetic.
      return { wasm, module, sourceSha256: createHash("sha256").update(source).digest("hex") };
    } finally {
      parsed.destroy();
    }
  })();
  assembled.set(weightMemories, p);
  return p;
}
