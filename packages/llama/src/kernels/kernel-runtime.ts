// One shared WasmMemory, the kernel instance on it, a bump allocator with a free list,
// and an optional second thread that shares each large matmul's rows with the caller. Knows pointers and
// shapes; the model decides what the buffers mean.
import { Worker } from "node:worker_threads";
import { AirmError, ConfigError } from "@airm/rm-core";
import { assembleKernels, type AssembledKernels } from "./assemble.ts";
import { GROUP_BLOCK_BYTES, KIND, type QuantKind } from "./quant-image.ts";
import { wasmApi, type WasmInstance, type WasmMemory, type WasmModule } from "./wasm-api.ts";

const PAGE = 65536;
const MAX_PAGES = 65536; // wasm32: 4 GiB
/**
 * A weight memory's usable bytes: below 4 GiB by a page, so that an image's end address (which the
 * kernels compute with i32 arithmetic) never wraps to 0.
 */
export const WEIGHT_MEMORY_BYTES = MAX_PAGES * PAGE - PAGE;
/** A weight address is memory * 2^32 + offset; memory 0 is the main one. */
const WEIGHT_MEMORY_STRIDE = 2 ** 32;
/** Matmul drivers per memory, by weight kind (quant-image.ts KIND). */
const KINDS = 9;
const ALIGN = 64;
/** Below this many output values a matmul stays on the calling thread (no effect on bits). */
const SPLIT_MIN_OUTPUTS = 256;
/**
 * How long a thread spins (atomic loads) before it sleeps on a futex: at most SPIN_LOADS
 * (roughly 0.1 ms). Each thread adapts its budget to its waits (adaptiveWait): spinning pays when the
 * other thread runs on another core, and only steals the core when both share one.
 */
const SPIN_LOADS = 20000;
const SPIN_MIN = 1000;
/** With a budget of 0, every this-many-th wait still spins SPIN_MIN loads to see whether spinning pays again. */
const PROBE_EVERY = 16;
/** Per-thread scratch of the matmul tiles: the bf16 4x4 tile's 16 accumulators, the quantized 4-token tile's sums and accumulators. */
const ACC_SCRATCH_BYTES = 1024;

interface KernelExports {
  matmul(w: number, x: number, y: number, T: number, cols: number, rows: number, r0: number, r1: number, acc: number): void;
  matmul_q8(w: number, x: number, y: number, T: number, cols: number, rows: number, r0: number, r1: number, scr: number): void;
  matmul_q4(w: number, x: number, y: number, T: number, cols: number, rows: number, r0: number, r1: number, scr: number): void;
  matmul_q4k(w: number, x: number, y: number, T: number, cols: number, rows: number, r0: number, r1: number, scr: number): void;
  matmul_q6k(w: number, x: number, y: number, T: number, cols: number, rows: number, r0: number, r1: number, scr: number): void;
  matmul_q4a8(w: number, x: number, y: number, T: number, cols: number, rows: number, r0: number, r1: number, scr: number): void;
  matmul_q4ka8(w: number, x: number, y: number, T: number, cols: number, rows: number, r0: number, r1: number, scr: number): void;
  matmul_q6ka8(w: number, x: number, y: number, T: number, cols: number, rows: number, r0: number, r1: number, scr: number): void;
  matmul_q5a8(w: number, x: number, y: number, T: number, cols: number, rows: number, r0: number, r1: number, scr: number): void;
  quant_x(src: number, dst: number, T: number, cols: number): void;
  quant_x8(src: number, dst: number, T: number, cols: number): void;
  pack_x(src: number, dst: number, T: number, cols: number): void;
  rmsnorm(x: number, w: number, out: number, n: number, eps: number): void;
  attn_scores(q: number, k: number, S: number, D: number, n: number, out: number): void;
  attn_values(p: number, v: number, D: number, n: number, out: number): void;
  attention(q: number, k: number, v: number, S: number, D: number, n: number, H: number, group: number, scale: number, p: number, out: number): void;
  attention_paged(
    q: number,
    table: number,
    kOff: number,
    vOff: number,
    bs: number,
    D: number,
    n: number,
    H: number,
    group: number,
    scale: number,
    p: number,
    out: number,
    window: number,
  ): void;
  attention_tiles(desc: number, bs: number, D: number, scaleBits: number, ps: number, lo: number, i0: number, i1: number, scratch: number): void;
  softmax(p: number, n: number, scale: number): void;
  swiglu(gu: number, act: number, I: number, T: number): void;
  geglu(gu: number, act: number, I: number, T: number): void;
  rope_kv(x: number, cs: number, heads: number, D: number, k: number, kv: number, kDst: number, vDst: number, S: number): void;
  exp_f32(src: number, dst: number, n: number): void;
  add_f32(dst: number, src: number, n: number): void;
  lora_update(x: number, xs: number, y: number, ys: number, T: number, a: number, b: number, cols: number, r: number, rows: number, scale: number, u: number): void;
  lora_update4(
    x0: number,
    x1: number,
    x2: number,
    x3: number,
    y0: number,
    y1: number,
    y2: number,
    y3: number,
    a: number,
    b: number,
    cols: number,
    r: number,
    rows: number,
    scale: number,
    u: number,
  ): void;
  lora_update2(x0: number, x1: number, y0: number, y1: number, a: number, b: number, cols: number, r: number, rows: number, scale: number, u: number): void;
  stream_read(p: number, bytes: number): number;
}

// Control words shared with the second thread. A split matmul is cut into chunks of rows that
// both threads claim one at a time (a compare-and-swap on C_CLAIM, which holds the job's tag and
// the next chunk), so a thread that is late or descheduled leaves its share to the other instead
// of holding the step; each output row is computed by one call either way (same bits).
const C_SEQ = 0; // job counter, bumped by the caller
const C_CLAIM = 1; // (job tag << 8) | next chunk index
const C_QUIT = 2;
const C_FAILED = 3;
const C_FINISHED = 4; // chunks finished in the current job
const C_ARGS = 5; // w, x, y, T, cols, rows, r0, r1, acc, kind, chunkRows, chunks
const CTRL_WORDS = 20;
/** Chunks per split matmul: enough for one thread to take over the other's share in small steps. */
const CHUNKS = 8;
/**
 * The job tag in C_CLAIM (23 bits keep the word positive; a thread would have to stall between
 * reading a job and claiming from it for 2^23 jobs to mistake a later job for it).
 */
const TAG_MASK = 0x7fffff;
/** The chunk index in C_CLAIM (claimChunks spells it as 0xff: the worker runs its source). */
const INDEX_MASK = 0xff;

/** A thread's adaptive spin budget (see adaptiveWait). */
interface SpinState {
  budget: number;
  waits: number;
}

/**
 * Waits until `ready(ctrl[word])`: spins through up to the state's budget of atomic loads, then
 * sleeps in Atomics.wait. The budget adapts: work that came during the spin doubles it (up to
 * `max`), a spin that ran out halves it (below `min`: 0, sleep at once), and with 0 every
 * `probeEvery`-th wait still spins `min` loads to see whether spinning pays again. Self-contained
 * (parameters only): the worker thread runs this function's own source.
 */
function adaptiveWait(ctrl: Int32Array, word: number, ready: (v: number) => boolean, s: SpinState, max: number, min: number, probeEvery: number): void {
  let v = Atomics.load(ctrl, word);
  if (ready(v)) return;
  const spin = s.budget > 0 ? s.budget : ++s.waits % probeEvery === 0 ? min : 0;
  for (let i = 0; !ready(v) && i < spin; i++) v = Atomics.load(ctrl, word);
  if (spin > 0) s.budget = ready(v) ? Math.min(max, Math.max(min, s.budget * 2)) : s.budget >> 1 < min ? 0 : s.budget >> 1;
  while (!ready((v = Atomics.load(ctrl, word)))) Atomics.wait(ctrl, word, v);
}

/**
 * Claims chunks of rows [r0, r1) of the job tagged `tag` (compare-and-swap on ctrl[claimWord],
 * which holds (tag << 16) | next chunk) and runs each with `run(a, b)` until none is left or a
 * later job has replaced this one; counts each finished chunk in ctrl[finishedWord] and wakes a
 * waiter after the last. Both threads run it (the worker thread from this function's source).
 */
function claimChunks(
  ctrl: Int32Array,
  claimWord: number,
  finishedWord: number,
  tag: number,
  r0: number,
  r1: number,
  chunkRows: number,
  chunks: number,
  run: (a: number, b: number) => void,
): void {
  for (;;) {
    const c = Atomics.load(ctrl, claimWord);
    if ((c & ~0xff) !== tag || (c & 0xff) >= chunks) return;
    if (Atomics.compareExchange(ctrl, claimWord, c, c + 1) !== c) continue;
    const a = r0 + (c & 0xff) * chunkRows;
    try {
      run(a, Math.min(r1, a + chunkRows));
    } finally {
      if (Atomics.add(ctrl, finishedWord, 1) + 1 === chunks) Atomics.notify(ctrl, finishedWord);
    }
  }
}

// Plain script (eval) so the worker needs no TypeScript loader; it only runs matmul row chunks.
const WORKER_SOURCE = `
const { workerData, parentPort } = require("node:worker_threads");
const { module, memory, weights, ctrl: ctrlBuffer } = workerData;
const ctrl = new Int32Array(ctrlBuffer);
const adaptiveWait = ${adaptiveWait.toString()};
const claimChunks = ${claimChunks.toString()};
const env = { memory };
weights.forEach((m, i) => { env["weights" + (i + 1)] = m; });
WebAssembly.instantiate(module, { env }).then((instance) => {
  // by memory, then weight kind: 0 bf16, 1 q8, 2 q4, 3 q4k, 4 q6k, 5 q4a8, 6 q4ka8, 7 q6ka8, 8 q5a8 (quant-image.ts KIND)
  const kernels = [];
  for (let m = 0; m <= weights.length; m++) {
    const s = m === 0 ? "" : "_w" + m;
    kernels.push(instance.exports["matmul" + s], instance.exports["matmul_q8" + s], instance.exports["matmul_q4" + s], instance.exports["matmul_q4k" + s], instance.exports["matmul_q6k" + s], instance.exports["matmul_q4a8" + s], instance.exports["matmul_q4ka8" + s], instance.exports["matmul_q6ka8" + s], instance.exports["matmul_q5a8" + s]);
  }
  // after every memory's matmuls: attention tiles (the same argument order)
  kernels.push(instance.exports.attention_tiles);
  parentPort.postMessage("ready");
  let last = 0;
  const spin = { budget: ${SPIN_LOADS}, waits: 0 };
  for (;;) {
    // The next matmul of a forward pass comes within microseconds, and a futex wake-up costs tens of them.
    adaptiveWait(ctrl, ${C_SEQ}, (v) => v !== last, spin, ${SPIN_LOADS}, ${SPIN_MIN}, ${PROBE_EVERY});
    const seq = (last = Atomics.load(ctrl, ${C_SEQ}));
    if (Atomics.load(ctrl, ${C_QUIT}) === 1) break;
    // Arguments read now belong to this job whenever a claim below succeeds: the caller closes
    // claims on a job (C_CLAIM moves to the next job's tag) before it writes the next one's.
    const [w, x, y, T, cols, rows, r0, r1, acc, kind, chunkRows, chunks] = ctrl.subarray(${C_ARGS}, ${C_ARGS + 12});
    // Arguments that changed while they were read belong to a later job (claims on this one are closed by then).
    if (Atomics.load(ctrl, ${C_SEQ}) !== seq) continue;
    claimChunks(ctrl, ${C_CLAIM}, ${C_FINISHED}, (seq & ${TAG_MASK}) << 8, r0, r1, chunkRows, chunks, (a, b) => {
      try {
        kernels[kind](w, x, y, T, cols, rows, a, b, acc);
      } catch (e) {
        Atomics.store(ctrl, ${C_FAILED}, 1);
      }
    });
  }
  parentPort.close();
});
`;

export interface KernelRuntimeOptions {
  threads?: 1 | 2;
  /** Bytes to reserve up front (weights); the memory grows later as needed. */
  initialBytes?: number;
  /**
   * Memories of their own for weight matrices (each up to WEIGHT_MEMORY_BYTES), besides the main
   * memory that holds everything else. 0 (the default): matrices live in the main memory too.
   */
  weightMemories?: number;
  /** Usable bytes of each weight memory (default WEIGHT_MEMORY_BYTES; tests make it small to spread a small model). */
  weightMemoryBytes?: number;
}

/** The kernels plus the memory they run on. Create with `KernelRuntime.create`. */
export class KernelRuntime {
  readonly memory: WasmMemory;
  /** The weight memories (`weights1` ... in the kernels); empty when matrices share the main memory. */
  readonly weightMemories: WasmMemory[];
  readonly threads: 1 | 2;
  readonly kernelSourceSha256: string;
  private readonly k: KernelExports;
  /** The matmul drivers by memory, then weight kind (quant-image.ts KIND): index KINDS * memory + kind. */
  private readonly matmuls: KernelExports["matmul"][];
  /** The next free offset in each weight memory (index 0 unused), and the one being filled. */
  private readonly weightTops: number[];
  private weightMemory = 1;
  private readonly weightMemoryBytes: number;
  private top = ALIGN; // address 0 stays unused
  private highWater = ALIGN; // below this, memory may hold old data
  private readonly freeBlocks: { ptr: number; bytes: number }[] = [];
  private worker: Worker | undefined;
  /**
   * With two threads: whether split work goes to the second one (true) or the calling thread
   * runs it all (the same bits either way: each output comes from one kernel call).
   */
  secondThread = true;
  private readonly ctrl: Int32Array;
  private seq = 0;
  /** This thread's spin budget while it waits for the other one's chunk (see adaptiveWait). */
  private readonly spin: SpinState = { budget: SPIN_LOADS, waits: 0 };
  private closed = false;
  /** 256 bytes of matmul accumulator scratch per thread (main, worker). */
  private readonly accScratch: [number, number];
  u8!: Uint8Array;
  u16!: Uint16Array;
  u32!: Uint32Array;
  f32!: Float32Array;

  private constructor(memory: WasmMemory, weightMemories: WasmMemory[], weightMemoryBytes: number, instance: WasmInstance, kernels: AssembledKernels, threads: 1 | 2) {
    this.memory = memory;
    this.weightMemoryBytes = weightMemoryBytes;
    this.weightMemories = weightMemories;
    this.weightTops = [0, ...weightMemories.map(() => ALIGN)];
    this.k = instance.exports as unknown as KernelExports;
    const ex = instance.exports as Record<string, KernelExports["matmul"]>;
    this.matmuls = [];
    for (let m = 0; m <= weightMemories.length; m++) {
      const s = m === 0 ? "" : `_w${m}`;
      this.matmuls.push(
        ex[`matmul${s}`],
        ex[`matmul_q8${s}`],
        ex[`matmul_q4${s}`],
        ex[`matmul_q4k${s}`],
        ex[`matmul_q6k${s}`],
        ex[`matmul_q4a8${s}`],
        ex[`matmul_q4ka8${s}`],
        ex[`matmul_q6ka8${s}`],
        ex[`matmul_q5a8${s}`],
      );
    }
    this.threads = threads;
    this.kernelSourceSha256 = kernels.sourceSha256;
    this.ctrl = new Int32Array(new SharedArrayBuffer(CTRL_WORDS * 4));
    this.refreshViews();
    const acc = this.alloc(2 * ACC_SCRATCH_BYTES);
    this.accScratch = [acc, acc + ACC_SCRATCH_BYTES];
  }

  /** Assembles the kernels (once per process), creates the memory and, for threads 2, starts the worker. */
  static async create(opts: KernelRuntimeOptions = {}): Promise<KernelRuntime> {
    const threads = opts.threads ?? 1;
    if (threads !== 1 && threads !== 2) throw new ConfigError("threads", `must be 1 or 2, got ${String(threads)}`);
    const weightCount = opts.weightMemories ?? 0;
    if (!Number.isInteger(weightCount) || weightCount < 0 || weightCount > 16) throw new ConfigError("weightMemories", `must be an integer in [0, 16], got ${String(weightCount)}`);
    const weightMemoryBytes = opts.weightMemoryBytes ?? WEIGHT_MEMORY_BYTES;
    if (!Number.isInteger(weightMemoryBytes) || weightMemoryBytes < PAGE || weightMemoryBytes > WEIGHT_MEMORY_BYTES) {
      throw new ConfigError("weightMemoryBytes", `must be an integer in [${PAGE}, ${WEIGHT_MEMORY_BYTES}], got ${String(weightMemoryBytes)}`);
    }
    const kernels = await assembleKernels(weightCount);
    const initialPages = Math.min(MAX_PAGES, Math.max(1, Math.ceil(((opts.initialBytes ?? 0) + 4 * PAGE) / PAGE)));
    let memory: WasmMemory;
    try {
      memory = new wasmApi.Memory({ initial: initialPages, maximum: MAX_PAGES, shared: true });
    } catch (e) {
      throw new AirmError("MODEL_LOAD", `cannot reserve ${initialPages * PAGE} bytes of wasm memory (4 GiB cap): ${(e as Error).message}`);
    }
    const weights: WasmMemory[] = [];
    const env: Record<string, WasmMemory> = { memory };
    for (let m = 1; m <= weightCount; m++) {
      try {
        weights.push(new wasmApi.Memory({ initial: 1, maximum: MAX_PAGES, shared: true }));
      } catch (e) {
        throw new AirmError("MODEL_LOAD", `cannot reserve weight memory ${m} of ${weightCount}: ${(e as Error).message}`);
      }
      env[`weights${m}`] = weights[m - 1];
    }
    const instance = await wasmApi.instantiate(kernels.module, { env });
    const rt = new KernelRuntime(memory, weights, weightMemoryBytes, instance, kernels, threads);
    if (threads === 2) await rt.startWorker(kernels.module);
    return rt;
  }

  private async startWorker(module: WasmModule): Promise<void> {
    const worker = new Worker(WORKER_SOURCE, { eval: true, workerData: { module, memory: this.memory, weights: this.weightMemories, ctrl: this.ctrl.buffer } });
    await new Promise<void>((resolve, reject) => {
      worker.once("message", () => resolve());
      worker.once("error", reject);
    });
    worker.unref();
    this.worker = worker;
  }

  private refreshViews(): void {
    const b = this.memory.buffer;
    this.u8 = new Uint8Array(b);
    this.u16 = new Uint16Array(b);
    this.u32 = new Uint32Array(b);
    this.f32 = new Float32Array(b);
  }

  /** The address the next allocation from the top would get (the end of everything allocated). */
  get allocationTop(): number {
    return this.top;
  }

  /** Current memory size in bytes. */
  get byteLength(): number {
    return this.memory.buffer.byteLength;
  }

  /** Allocates `bytes` (64-byte aligned, zeroed). Throws AirmError MODEL_LOAD past the 4 GiB cap. */
  alloc(bytes: number): number {
    const size = Math.ceil(Math.max(bytes, 1) / ALIGN) * ALIGN;
    const i = this.freeBlocks.findIndex((b) => b.bytes >= size);
    if (i >= 0) {
      const block = this.freeBlocks[i];
      const ptr = block.ptr;
      if (block.bytes === size) this.freeBlocks.splice(i, 1);
      else this.freeBlocks[i] = { ptr: ptr + size, bytes: block.bytes - size };
      this.u8.fill(0, ptr, ptr + size);
      return ptr;
    }
    const ptr = this.top;
    const end = ptr + size;
    if (end > MAX_PAGES * PAGE) {
      throw new AirmError("MODEL_LOAD", `wasm memory exhausted: need ${end} bytes, the cap is 4 GiB; use a smaller context S or fewer caches`);
    }
    const have = this.memory.buffer.byteLength;
    if (end > have) {
      try {
        this.memory.grow(Math.ceil((end - have) / PAGE));
      } catch (e) {
        throw new AirmError("MODEL_LOAD", `cannot grow wasm memory to ${end} bytes: ${(e as Error).message}`);
      }
      this.refreshViews();
    }
    this.top = end;
    if (ptr < this.highWater) this.u8.fill(0, ptr, Math.min(end, this.highWater));
    if (end > this.highWater) this.highWater = end;
    return ptr;
  }

  /**
   * Allocates a weight matrix image of `bytes` (64-byte aligned, zeroed) and returns its weight
   * address (memory * 2^32 + offset; see weightView). Without weight memories this is `alloc`.
   * With them, images fill weight memory 1, then 2, ...; no image spans two memories. Throws
   * AirmError MODEL_LOAD when the weight memories are full.
   */
  allocWeights(bytes: number): number {
    if (this.weightMemories.length === 0) return this.alloc(bytes);
    const size = Math.ceil(Math.max(bytes, 1) / ALIGN) * ALIGN;
    if (size > this.weightMemoryBytes - ALIGN) throw new AirmError("MODEL_LOAD", `a weight matrix of ${bytes} bytes exceeds one weight memory (${this.weightMemoryBytes} bytes)`);
    while (this.weightTops[this.weightMemory] + size > this.weightMemoryBytes) {
      if (this.weightMemory === this.weightMemories.length) {
        throw new AirmError(
          "MODEL_LOAD",
          `the ${this.weightMemories.length} weight memories are full: a matrix of ${bytes} bytes does not fit; the runtime was created with too few weightMemories`,
        );
      }
      this.weightMemory++;
    }
    const m = this.weightMemory;
    const mem = this.weightMemories[m - 1];
    const ptr = this.weightTops[m];
    const end = ptr + size;
    const have = mem.buffer.byteLength;
    if (end > have) {
      try {
        mem.grow(Math.ceil((end - have) / PAGE));
      } catch (e) {
        throw new AirmError("MODEL_LOAD", `cannot grow weight memory ${m} to ${end} bytes: ${(e as Error).message}`);
      }
    }
    this.weightTops[m] = end;
    return m * WEIGHT_MEMORY_STRIDE + ptr;
  }

  /**
   * The memory that holds weight address `w` (see allocWeights) as fresh byte views, and `w`'s
   * byte offset in it. Take new views after any allocation (a memory may have grown).
   */
  weightView(w: number): { u8: Uint8Array; u16: Uint16Array; offset: number } {
    const m = Math.floor(w / WEIGHT_MEMORY_STRIDE);
    const offset = w - m * WEIGHT_MEMORY_STRIDE;
    if (m === 0) return { u8: this.u8, u16: this.u16, offset };
    const mem = this.weightMemories[m - 1];
    if (mem === undefined) throw new AirmError("MODEL_LOAD", `weight address ${w} names weight memory ${m}, this runtime has ${this.weightMemories.length}`);
    return { u8: new Uint8Array(mem.buffer), u16: new Uint16Array(mem.buffer), offset };
  }

  /** The used bytes of each weight memory, [start, end) (the packed image's order after the main memory's range). */
  weightRanges(): { memory: number; start: number; end: number }[] {
    return this.weightMemories.map((_, i) => ({ memory: i + 1, start: ALIGN, end: this.weightTops[i + 1] }));
  }

  /** Returns a block to the free list (it is zeroed again when reused). */
  free(ptr: number, bytes: number): void {
    const size = Math.ceil(Math.max(bytes, 1) / ALIGN) * ALIGN;
    if (ptr + size === this.top) this.top = ptr;
    else this.freeBlocks.push({ ptr, bytes: size });
  }

  /**
   * Y[t][r] = W[r] . X[t] for t < T, r < rows. W: the bf16 image at `w` (see weight-image.ts),
   * X: f32 [T][cols] packed by packX, Y: f32 [T][rows]. With two threads the rows are split
   * (never the sum).
   */
  matmul(w: number, x: number, y: number, T: number, cols: number, rows: number): void {
    const m = Math.floor(w / WEIGHT_MEMORY_STRIDE);
    this.run(KINDS * m, w - m * WEIGHT_MEMORY_STRIDE, x, y, T, cols, rows, 0, rows);
  }

  /**
   * Rows [r0, r1) (multiples of 4) of Y = W X for a quantized image of `kind` at `w` that holds
   * exactly those rows (quant-image.ts), X quantized by quantX, Y: f32 [T][rows] (rows = the
   * full output width). With two threads the rows are split (never the sum).
   */
  matmulQ(kind: QuantKind, w: number, x: number, y: number, T: number, cols: number, rows: number, r0 = 0, r1 = rows): void {
    // The kernels address group (r >> 2) from w: shift w back so the image's first group is row r0's.
    const m = Math.floor(w / WEIGHT_MEMORY_STRIDE);
    const base = (w - m * WEIGHT_MEMORY_STRIDE - (r0 >> 2) * (cols >> 5) * GROUP_BLOCK_BYTES[kind]) | 0;
    this.run(KINDS * m + KIND[kind], base, x, y, T, cols, rows, r0, r1);
  }

  private run(kind: number, w: number, x: number, y: number, T: number, cols: number, rows: number, r0: number, r1: number): void {
    const fn = this.matmuls[kind]!;
    const n = r1 - r0;
    if (this.worker === undefined || !this.secondThread || n * T < SPLIT_MIN_OUTPUTS || n < 8) {
      fn(w, x, y, T, cols, rows, r0, r1, this.accScratch[0]);
      return;
    }
    const chunkRows = Math.max(8, (Math.ceil(n / CHUNKS) + 3) & ~3); // a multiple of 4
    this.split(fn, kind, [w, x, y, T, cols, rows], r0, r1, chunkRows, this.accScratch);
  }

  /**
   * Runs `fn(a0..a5, from, to, scratch)` over [r0, r1) on both threads: the range is cut into
   * chunks of `chunkRows` that each thread claims (the worker runs its kernel number `kind` with
   * `scratch[1]`, this thread `fn` with `scratch[0]`), and returns once every chunk is done.
   */
  private split(fn: KernelExports["matmul"], kind: number, a: number[], r0: number, r1: number, chunkRows: number, scratch: readonly [number, number]): void {
    const [w, x, y, T, cols, rows] = a;
    const chunks = Math.ceil((r1 - r0) / chunkRows);
    if (chunks >= INDEX_MASK) throw new AirmError("MODEL_LOAD", `a split job of ${chunks} chunks (at most ${INDEX_MASK - 1})`);
    const c = this.ctrl;
    const seq = ++this.seq;
    const tag = (seq & TAG_MASK) << 8;
    // Claims close before the arguments change: a thread late for the last job, which may read
    // some of this job's arguments, can no longer claim a chunk of it (its tag no longer matches).
    Atomics.store(c, C_CLAIM, tag | INDEX_MASK);
    c[C_ARGS] = w;
    c[C_ARGS + 1] = x;
    c[C_ARGS + 2] = y;
    c[C_ARGS + 3] = T;
    c[C_ARGS + 4] = cols;
    c[C_ARGS + 5] = rows;
    c[C_ARGS + 6] = r0;
    c[C_ARGS + 7] = r1;
    c[C_ARGS + 8] = scratch[1];
    c[C_ARGS + 9] = kind;
    c[C_ARGS + 10] = chunkRows;
    c[C_ARGS + 11] = chunks;
    Atomics.store(c, C_FINISHED, 0);
    Atomics.store(c, C_CLAIM, tag);
    Atomics.store(c, C_SEQ, seq);
    Atomics.notify(c, C_SEQ);
    const acc = scratch[0];
    claimChunks(c, C_CLAIM, C_FINISHED, tag, r0, r1, chunkRows, chunks, (i, j) => fn(w, x, y, T, cols, rows, i, j, acc));
    // Only a chunk the other thread is computing right now is left to wait for.
    adaptiveWait(c, C_FINISHED, (done) => done >= chunks, this.spin, SPIN_LOADS, SPIN_MIN, PROBE_EVERY);
    const finished = Atomics.load(c, C_FINISHED);
    if (finished !== chunks) throw new AirmError("MODEL_LOAD", `kernel threads out of step: ${finished} chunks finished of a job of ${chunks}; reload the model with threads: 1`);
    if (Atomics.load(c, C_FAILED) === 1) throw new AirmError("MODEL_LOAD", "the second kernel thread failed; reload the model with threads: 1");
  }

  /**
   * Packs f32 X [T][cols] at `src` into matmul input order at `dst` (same size): blocks of 8
   * reordered [0 2 4 6 1 3 5 7], tokens grouped in quads; see pack_x in kernels.wat.
   */
  packX(src: number, dst: number, T: number, cols: number): void {
    this.k.pack_x(src, dst, T, cols);
  }

  /**
   * Quantizes f32 X [T][cols] at `src` (cols % 32 == 0) to the q8/q4 kernels' input at `dst`:
   * per token and block of 32, 16-bit integers with an f32 scale and scaled sum; needs
   * ceil(T/4) * cols * 9 bytes (see quant_x in kernels.wat).
   */
  quantX(src: number, dst: number, T: number, cols: number): void {
    this.k.quant_x(src, dst, T, cols);
  }

  /**
   * Quantizes f32 X [T][cols] at `src` (cols % 32 == 0) to the 8-bit input of the q4a8, q4ka8 and
   * q6ka8 kernels at `dst`: per token and block of 32, q in [-127, 127], an f32 scale, scaled sum
   * and the integer sums of each 16-column half; needs
   * T * cols * 1.5 bytes (see quant_x8 in kernels.wat).
   */
  quantX8(src: number, dst: number, T: number, cols: number): void {
    this.k.quant_x8(src, dst, T, cols);
  }

  /** out = x / sqrt(mean(x^2) + eps) * w, all f32, n % 4 == 0. */
  rmsnorm(x: number, w: number, out: number, n: number, eps: number): void {
    this.k.rmsnorm(x, w, out, n, eps);
  }

  /** out[s] = sum_d q[d] K[d][s] for s < n (rounded up to 4); K bf16 [D][S]. */
  attnScores(q: number, k: number, S: number, D: number, n: number, out: number): void {
    this.k.attn_scores(q, k, S, D, n, out);
  }

  /** out[d] = sum_s p[s] V[s][d] for s < n; V bf16 [S][D]. */
  attnValues(p: number, v: number, D: number, n: number, out: number): void {
    this.k.attn_values(p, v, D, n, out);
  }

  /**
   * Attention of one token over positions [0, n) of one cache layer, all H query heads: for head h,
   * scores against K of KV head floor(h / group), softmax at `scale`, weighted sum of V, into
   * out[h*D..]. q f32 [H][D]; k/v the layer's K [KV][D][S] and V [KV][S][D] (bf16); p: f32 scratch
   * with room for n rounded up to 4.
   */
  attention(q: number, k: number, v: number, S: number, D: number, n: number, H: number, group: number, scale: number, p: number, out: number): void {
    this.k.attention(q, k, v, S, D, n, H, group, scale, p, out);
  }

  /**
   * `attention` over a paged cache (layout rngd-pd/v2): `table` holds the i32 byte addresses of
   * the sequence's blocks in position order; this layer's K of KV head g is at block + kOff +
   * g*D*bs*2 ([D][bs]) and its V at block + vOff + g*bs*D*2 ([bs][D]). Same bits as `attention`
   * over the same positions in the contiguous layout. `window` > 0 (a sliding window) attends
   * only the last `window` positions [max(0, n - window), n); 0 attends all of [0, n).
   */
  attentionPaged(
    q: number,
    table: number,
    kOff: number,
    vOff: number,
    bs: number,
    D: number,
    n: number,
    H: number,
    group: number,
    scale: number,
    p: number,
    out: number,
    window = 0,
  ): void {
    this.k.attention_paged(q, table, kOff, vOff, bs, D, n, H, group, scale, p, out, window);
  }

  /**
   * Runs `count` attention tiles (kernels.wat attention_tiles: four queries of one KV head each,
   * 64-byte descriptors at `desc`) with the layer offset `lo`, split between the two threads by
   * tile (each tile's outputs come from one thread: the same bits either way). `scratch` holds
   * each thread's scores: 4 x `ps` bytes.
   */
  attentionTiles(desc: number, count: number, bs: number, D: number, scale: number, ps: number, lo: number, scratch: readonly [number, number]): void {
    const scaleBits = new Int32Array(new Float32Array([scale]).buffer)[0];
    const fn = this.k.attention_tiles as unknown as KernelExports["matmul"];
    if (this.worker === undefined || !this.secondThread || count < 2) {
      fn(desc, bs, D, scaleBits, ps, lo, 0, count, scratch[0]);
      return;
    }
    this.split(fn, KINDS * (this.weightMemories.length + 1), [desc, bs, D, scaleBits, ps, lo], 0, count, Math.max(1, Math.ceil(count / CHUNKS)), scratch);
  }

  /** p[i] = softmax(p[i] * scale) over [0, n), the kernel's exp, sum in increasing i; room for n rounded up to 4. */
  softmax(p: number, n: number, scale: number): void {
    this.k.softmax(p, n, scale);
  }

  /** act[t][i] = silu(gu[t][i]) * gu[t][I + i] for t < T, i < I (I % 4 == 0), all f32. */
  swiglu(gu: number, act: number, I: number, T: number): void {
    this.k.swiglu(gu, act, I, T);
  }

  /** act[t][i] = gelu_tanh(gu[t][i]) * gu[t][I + i] (kernels.wat geglu: g / (1 + exp(-2u))), as swiglu. */
  geglu(gu: number, act: number, I: number, T: number): void {
    this.k.geglu(gu, act, I, T);
  }

  /**
   * One token: rotates `heads` consecutive heads of D f32 at `x` (rotate_half) with the cos/sin row
   * at `cs` (D/2 cos then D/2 sin, f32), then appends the `kv` heads of K at `k` (after rotation)
   * and of V (right after them) to a cache layer as bf16 (round to nearest even): `kDst` and
   * `vDst` are the addresses of position pos of head 0 in the layer's K [KV][D][S] and V [KV][S][D].
   */
  ropeKv(x: number, cs: number, heads: number, D: number, k: number, kv: number, kDst: number, vDst: number, S: number): void {
    this.k.rope_kv(x, cs, heads, D, k, kv, kDst, vDst, S);
  }

  /** dst[i] += src[i] for i < n (f32, n % 4 == 0). */
  addF32(dst: number, src: number, n: number): void {
    this.k.add_f32(dst, src, n);
  }

  /**
   * The low-rank update of a LoRA adapter for T tokens (kernels.wat lora_update), on the calling
   * thread: for token t, with x_t = x + t*xs and y_t = y + t*ys (byte strides, f32 rows),
   * u = A x_t (A f32 [r][cols]), y_t[o] += dot(B[o], u) * scale (B f32 [rows][rp], rp = r rounded
   * up to 4, zero past r). `u`: rp f32 of scratch. Each token's outputs depend on its own row only.
   */
  loraUpdate(x: number, xs: number, y: number, ys: number, T: number, lora: { a: number; b: number; cols: number; r: number; rows: number; scale: number }, u: number): void {
    this.k.lora_update(x, xs, y, ys, T, lora.a, lora.b, lora.cols, lora.r, lora.rows, lora.scale, u);
  }

  /**
   * loraUpdate for tokens anywhere in a pass: token i's input row at `xs[i]`, its output row at
   * `ys[i]`, in tiles of 4, then 2, then 1 (kernels.wat lora_update4 / lora_update2 / lora_update),
   * which read A and B once per tile and do each token's f32 operations in lora_update's order: the
   * same bits in any tile. `u`: 4 * rp f32 of scratch.
   */
  loraUpdateRows(xs: readonly number[], ys: readonly number[], lora: { a: number; b: number; cols: number; r: number; rows: number; scale: number }, u: number): void {
    const { a, b, cols, r, rows, scale } = lora;
    let i = 0;
    for (; i + 4 <= xs.length; i += 4) this.k.lora_update4(xs[i]!, xs[i + 1]!, xs[i + 2]!, xs[i + 3]!, ys[i]!, ys[i + 1]!, ys[i + 2]!, ys[i + 3]!, a, b, cols, r, rows, scale, u);
    if (i + 2 <= xs.length) {
      this.k.lora_update2(xs[i]!, xs[i + 1]!, ys[i]!, ys[i + 1]!, a, b, cols, r, rows, scale, u);
      i += 2;
    }
    if (i < xs.length) this.k.lora_update(xs[i]!, 0, ys[i]!, 0, 1, a, b, cols, r, rows, scale, u);
  }

  /** dst[i] = the kernel's exp(src[i]) for i < n (n % 4 == 0); f32. */
  expF32(src: number, dst: number, n: number): void {
    this.k.exp_f32(src, dst, n);
  }

  /** Streams `bytes` (multiple of 128) from weight address `w`; returns a fold of the data (keeps the loop alive). */
  streamRead(w: number, bytes: number): number {
    const m = Math.floor(w / WEIGHT_MEMORY_STRIDE);
    const fn = m === 0 ? this.k.stream_read : (this.k as unknown as Record<string, KernelExports["stream_read"]>)[`stream_read_w${m}`];
    return fn(w - m * WEIGHT_MEMORY_STRIDE, bytes);
  }

  /** Stops the second thread. The memory is released with the last reference. */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    if (this.worker) {
      Atomics.store(this.ctrl, C_QUIT, 1);
      Atomics.store(this.ctrl, C_SEQ, ++this.seq);
      Atomics.notify(this.ctrl, C_SEQ);
      void this.worker.terminate();
      this.worker = undefined;
    }
  }
}
