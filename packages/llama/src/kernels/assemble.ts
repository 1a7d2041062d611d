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
  "rope=f64 cos/sin of f32 angle rounded to f32,rotate_half",
  "rmsnorm=(x*inv)*w,inv=1/sqrt(ss/n+eps) f32",
  "split=rows|heads only",
  "quantized=GGUF Q8_0/Q4_0(as m=-8d)/Q4_1 blocks in 4-row groups, x as i16 per 32-block (d=amax/32767, nearest-even), isum exact i32, acc+=f32(isum)*(dw*dx) then +=m*sx, blocks in order",
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

let assembled: Promise<AssembledKernels> | undefined;

/** Assembles (once per process) and compiles the kernel module. Throws AirmError MODEL_LOAD when the WAT is missing or invalid. */
export function assembleKernels(): Promise<AssembledKernels> {
  assembled ??= (async () => {
    const path = watPath();
    const text = readFileSync(path, "utf8");
    const wabt = await wabtInit();
    const parsed = wabt.parseWat(path, text, { simd: true, threads: true });
    try {
      parsed.resolveNames();
      // WebAssembly.compile validates; wabt's own validator rejects shared memory imports.
      const wasm = parsed.toBinary({}).buffer.slice();
      const module = await wasmApi.compile(wasm);
      return { wasm, module, sourceSha256: createHash("sha256").update(text).digest("hex") };
    } finally {
      parsed.destroy();
    }
  })();
  return assembled;
}
