// koffi binding to the subset of the Rebellions RBLN SDK C runtime API (rbln.h, installed by the
// apt package rbln-sdk as /usr/local/include/rbln/rbln.h + /usr/local/lib/librbln_runtime.so)
// that a decode engine needs: load a compiled .rbln graph, open a synchronous runtime on a device,
// set host inputs, run, read outputs. Signatures follow the SDK's C API reference (v0.12:
// rbln_create_runtime takes model, module name, device id, input-info index). Tensor layouts
// are used only through rbln_get_layout_nbytes, so the struct's fields never cross the boundary.
// Knows nothing about models or KV; rbln-decode-graph.ts gives the inputs their meaning.

import { existsSync } from "node:fs";
import koffi from "koffi";
import { NativeRuntimeError } from "@airm/engine-kit";

/** Where the SDK installs the runtime library. */
export const DEFAULT_RBLN_LIBRARY = "/usr/local/lib/librbln_runtime.so";

/** `configured` (AIRM_RBLN_LIB) when set (even if missing: the caller reports it), else the SDK path if it exists, else null. */
export function findRblnLibrary(configured: string | undefined): string | null {
  if (configured) return configured;
  return existsSync(DEFAULT_RBLN_LIBRARY) ? DEFAULT_RBLN_LIBRARY : null;
}

type Pointer = unknown;

interface RblnFunctions {
  rbln_create_model(path: string): Pointer | null;
  rbln_destroy_model(model: Pointer): void;
  rbln_create_runtime(model: Pointer, name: string | null, deviceId: number, inputInfoIndex: number): Pointer | null;
  rbln_destroy_runtime(rt: Pointer): void;
  rbln_get_num_inputs(rt: Pointer): number;
  rbln_get_num_outputs(rt: Pointer): number;
  rbln_get_input_layout(rt: Pointer, index: number): Pointer | null;
  rbln_get_output_layout(rt: Pointer, index: number): Pointer | null;
  rbln_get_layout_nbytes(layout: Pointer): number | bigint;
  rbln_set_input(rt: Pointer, index: number, data: Pointer): number;
  rbln_run(rt: Pointer): number;
  rbln_get_output(rt: Pointer, index: number): Pointer | null;
  rbln_get_last_error_msg(): string | null;
}

let rblnTypes: { model: unknown; runtime: unknown; layout: unknown } | undefined;

/** The SDK's opaque handle types, declared once per process (koffi type names are global). */
function handleTypes(): { model: unknown; runtime: unknown; layout: unknown } {
  rblnTypes ??= {
    model: koffi.pointer(koffi.opaque("RBLNModel")),
    runtime: koffi.pointer(koffi.opaque("RBLNRuntime")),
    layout: koffi.pointer(koffi.opaque("RBLNTensorLayout")),
  };
  return rblnTypes;
}

/** RBLNRetCode values from the SDK header. */
export const RBLN_SUCCESS = 0;
const RET_NAMES = ["SUCCESS", "FAILURE", "INVALID"];

/** The loaded library: one per path per process. */
export class RblnRuntimeLibrary {
  readonly path: string;
  /** @internal */ readonly fn: RblnFunctions;
  private static readonly loaded = new Map<string, RblnRuntimeLibrary>();

  private constructor(path: string, fn: RblnFunctions) {
    this.path = path;
    this.fn = fn;
  }

  /**
   * Loads `path` and resolves every bound symbol. Throws NativeRuntimeError naming the missing
   * file or symbol (an SDK older than the API this binds).
   */
  static open(path: string): RblnRuntimeLibrary {
    const hit = RblnRuntimeLibrary.loaded.get(path);
    if (hit) return hit;
    if (!existsSync(path)) throw new NativeRuntimeError("dlopen", `${path} does not exist; install rbln-sdk or point AIRM_RBLN_LIB at librbln_runtime.so`);
    let lib: ReturnType<typeof koffi.load>;
    try {
      lib = koffi.load(path);
    } catch (e) {
      throw new NativeRuntimeError("dlopen", `cannot load ${path}: ${(e as Error).message}`, { cause: e });
    }
    const { model: m, runtime: r, layout: l } = handleTypes();
    const bind = <K extends keyof RblnFunctions>(name: K, ret: unknown, args: unknown[]): RblnFunctions[K] => {
      try {
        return lib.func(name, ret as never, args as never) as unknown as RblnFunctions[K];
      } catch (e) {
        throw new NativeRuntimeError("dlsym", `${path} lacks ${name} (${(e as Error).message}); this binding needs the rbln-sdk C API`, { cause: e });
      }
    };
    const fn: RblnFunctions = {
      rbln_create_model: bind("rbln_create_model", m, ["const char *"]),
      rbln_destroy_model: bind("rbln_destroy_model", "void", [m]),
      rbln_create_runtime: bind("rbln_create_runtime", r, [m, "const char *", "int", "int"]),
      rbln_destroy_runtime: bind("rbln_destroy_runtime", "void", [r]),
      rbln_get_num_inputs: bind("rbln_get_num_inputs", "uint32_t", [r]),
      rbln_get_num_outputs: bind("rbln_get_num_outputs", "uint32_t", [r]),
      rbln_get_input_layout: bind("rbln_get_input_layout", l, [r, "uint32_t"]),
      rbln_get_output_layout: bind("rbln_get_output_layout", l, [r, "uint32_t"]),
      rbln_get_layout_nbytes: bind("rbln_get_layout_nbytes", "uint64_t", [l]),
      rbln_set_input: bind("rbln_set_input", "int", [r, "uint32_t", "const void *"]),
      rbln_run: bind("rbln_run", "int", [r]),
      rbln_get_output: bind("rbln_get_output", "void *", [r, "uint32_t"]),
      rbln_get_last_error_msg: bind("rbln_get_last_error_msg", "const char *", []),
    };
    const out = new RblnRuntimeLibrary(path, fn);
    RblnRuntimeLibrary.loaded.set(path, out);
    return out;
  }

  /** The runtime's last error message ("" when none). */
  lastError(): string {
    return this.fn.rbln_get_last_error_msg() ?? "";
  }
}

/**
 * One compiled graph opened on one device (rbln_create_model + rbln_create_runtime). Inputs are
 * copied into staging memory owned here, so the runtime may keep their addresses until `run()`.
 * Not thread-safe; close() once.
 */
export class RblnGraphSession {
  readonly graphPath: string;
  readonly deviceId: number;
  readonly inputBytes: number[];
  readonly outputBytes: number[];
  private readonly lib: RblnRuntimeLibrary;
  private model: Pointer | null;
  private rt: Pointer | null;
  private readonly staging: { ptr: Pointer; view: Uint8Array }[];

  /** Throws NativeRuntimeError with the runtime's own message when the graph or device is refused. */
  constructor(lib: RblnRuntimeLibrary, graphPath: string, deviceId: number) {
    this.lib = lib;
    this.graphPath = graphPath;
    this.deviceId = deviceId;
    const f = lib.fn;
    this.model = f.rbln_create_model(graphPath);
    if (!this.model) throw new NativeRuntimeError("rbln_create_model", `${graphPath}: ${lib.lastError() || "failed"}`);
    this.rt = f.rbln_create_runtime(this.model, "default", deviceId, 0);
    if (!this.rt) {
      const msg = lib.lastError();
      f.rbln_destroy_model(this.model);
      this.model = null;
      throw new NativeRuntimeError("rbln_create_runtime", `device ${deviceId}: ${msg || "failed"}`);
    }
    const nIn = f.rbln_get_num_inputs(this.rt);
    const nOut = f.rbln_get_num_outputs(this.rt);
    const bytesOf = (layout: Pointer | null, what: string): number => {
      if (!layout) throw new NativeRuntimeError("rbln_get_layout", `${what} has no layout`);
      return Number(f.rbln_get_layout_nbytes(layout));
    };
    this.inputBytes = Array.from({ length: nIn }, (_, i) => bytesOf(f.rbln_get_input_layout(this.rt, i), `input ${i}`));
    this.outputBytes = Array.from({ length: nOut }, (_, o) => bytesOf(f.rbln_get_output_layout(this.rt, o), `output ${o}`));
    this.staging = this.inputBytes.map((n) => {
      const ptr = koffi.alloc("uint8_t", n);
      return { ptr, view: new Uint8Array(koffi.view(ptr, n)) };
    });
  }

  private live(): Pointer {
    if (!this.rt) throw new NativeRuntimeError("session", `${this.graphPath} is closed`);
    return this.rt;
  }

  /** Copies `data` (exactly the input's byte size) into input `index`. */
  setInput(index: number, data: Uint8Array): void {
    const rt = this.live();
    const want = this.inputBytes[index];
    if (want === undefined) throw new NativeRuntimeError("rbln_set_input", `input ${index} does not exist (graph has ${this.inputBytes.length})`);
    if (data.length !== want) throw new NativeRuntimeError("rbln_set_input", `input ${index} takes ${want} bytes, got ${data.length}`);
    const st = this.staging[index];
    st.view.set(data);
    const rc = this.lib.fn.rbln_set_input(rt, index, st.ptr);
    if (rc !== RBLN_SUCCESS) throw new NativeRuntimeError("rbln_set_input", `input ${index}: ${RET_NAMES[rc] ?? rc}: ${this.lib.lastError()}`);
  }

  /** Runs the graph synchronously. */
  run(): void {
    const rc = this.lib.fn.rbln_run(this.live());
    if (rc !== RBLN_SUCCESS) throw new NativeRuntimeError("rbln_run", `${RET_NAMES[rc] ?? rc}: ${this.lib.lastError()}`);
  }

  /** A copy of output `index` after `run()`. */
  output(index: number): Uint8Array {
    const rt = this.live();
    const n = this.outputBytes[index];
    if (n === undefined) throw new NativeRuntimeError("rbln_get_output", `output ${index} does not exist (graph has ${this.outputBytes.length})`);
    const ptr = this.lib.fn.rbln_get_output(rt, index);
    if (!ptr) throw new NativeRuntimeError("rbln_get_output", `output ${index}: ${this.lib.lastError() || "NULL"}`);
    return new Uint8Array(koffi.view(ptr, n)).slice();
  }

  close(): void {
    if (this.rt) this.lib.fn.rbln_destroy_runtime(this.rt);
    if (this.model) this.lib.fn.rbln_destroy_model(this.model);
    this.rt = null;
    this.model = null;
    for (const s of this.staging) koffi.free(s.ptr);
    this.staging.length = 0;
  }
}
