// The koffi binding to UCX's libucp (Debian libucx0, API 1.13): the handful of calls this
// transport makes, the struct layouts they take (x86_64, checked against ucp.h 1.13), the status
// codes, and the libc calls the progress thread sleeps in. It knows nothing about blobs or arenas.

import koffi, { type LibraryHandle } from "koffi";
import { TransportError } from "@airm/rm-core";

/** ucs_status_t values this package reacts to. */
export const UCS_OK = 0;
export const UCS_INPROGRESS = 1;
export const UCS_ERR_BUSY = -15;
export const UCS_ERR_UNREACHABLE = -6;

/** ucp_params_t field and feature bits. */
const UCP_PARAM_FIELD_FEATURES = 1n << 0n;
export const UCP_FEATURE_RMA = 1n << 1n;
export const UCP_FEATURE_WAKEUP = 1n << 4n;
/** ucp_ep_params_t bits. */
const UCP_EP_PARAM_FIELD_REMOTE_ADDRESS = 1n << 0n;
const UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE = 1n << 1n;
const UCP_EP_PARAM_FIELD_ERR_HANDLER = 1n << 2n;
export const UCP_ERR_HANDLING_MODE_NONE = 0;
export const UCP_ERR_HANDLING_MODE_PEER = 1;
/** ucp_mem_map_params_t bits. */
const UCP_MEM_MAP_PARAM_FIELD_ADDRESS = 1n << 0n;
const UCP_MEM_MAP_PARAM_FIELD_LENGTH = 1n << 1n;
const UCP_MEM_MAP_PARAM_FIELD_FLAGS = 1n << 2n;
const UCP_MEM_MAP_ALLOCATE = 1 << 1;
const UCP_MEM_ATTR_FIELD_ADDRESS = 1n << 0n;
const UCP_MEM_ATTR_FIELD_LENGTH = 1n << 1n;
/** ucp_request_param_t bits. */
const UCP_OP_ATTR_FIELD_FLAGS = 1 << 4;
const UCP_OP_ATTR_FIELD_MEMH = 1 << 8;
const UCP_EP_CLOSE_FLAG_FORCE = 1 << 0;

/** Struct sizes on x86_64 (ucp.h 1.13). */
const SIZEOF_UCP_PARAMS = 80;
const SIZEOF_UCP_WORKER_PARAMS = 200;
const SIZEOF_UCP_EP_PARAMS = 104;
const SIZEOF_UCP_MEM_MAP_PARAMS = 40;
const SIZEOF_UCP_MEM_ATTR = 32;
const SIZEOF_UCP_REQUEST_PARAM = 72;

const POLLIN = 0x001;

type Ptr = unknown;

interface RawUcp {
  getVersionString(): string;
  configRead(envPrefix: null, filename: null, out: Ptr[]): number;
  configModify(config: Ptr, name: string, value: string): number;
  configRelease(config: Ptr): void;
  initVersion(major: number, minor: number, params: Buffer, config: Ptr, out: Ptr[]): number;
  cleanup(ctx: Ptr): void;
  contextPrintInfo(ctx: Ptr, stream: Ptr): void;
  workerCreate(ctx: Ptr, params: Buffer, out: Ptr[]): number;
  workerDestroy(worker: Ptr): void;
  workerGetAddress(worker: Ptr, out: Ptr[], len: number[]): number;
  workerReleaseAddress(worker: Ptr, address: Ptr): void;
  workerPrintInfo(worker: Ptr, stream: Ptr): void;
  workerProgress(worker: Ptr): number;
  workerGetEfd(worker: Ptr, fd: number[]): number;
  workerArm(worker: Ptr): number;
  memMap(ctx: Ptr, params: Buffer, out: Ptr[]): number;
  memUnmap(ctx: Ptr, memh: Ptr): number;
  memQuery(memh: Ptr, attr: Buffer): number;
  rkeyPack(ctx: Ptr, memh: Ptr, out: Ptr[], len: number[]): number;
  rkeyBufferRelease(buf: Ptr): void;
  epCreate(worker: Ptr, params: Buffer, out: Ptr[]): number;
  epCloseNbx(ep: Ptr, param: Buffer): number;
  epRkeyUnpack(ep: Ptr, rkeyBuffer: Buffer, out: Ptr[]): number;
  rkeyDestroy(rkey: Ptr): void;
  getNbx(ep: Ptr, buffer: number, count: number, remoteAddr: number, rkey: Ptr, param: Buffer): number;
  putNbx(ep: Ptr, buffer: number, count: number, remoteAddr: number, rkey: Ptr, param: Buffer): number;
  requestCheckStatus(request: number): number;
  requestFree(request: number): void;
  statusString(status: number): string;
  // libc
  pointerOf(address: number, src: number, n: number): Ptr;
  schedYield(): number;
  poll(fds: Buffer, nfds: number, timeoutMs: number): number;
  eventfd(initval: number, flags: number): number;
  write(fd: number, buf: Buffer, n: number): number;
  read(fd: number, buf: Buffer, n: number): number;
  close(fd: number): number;
  fopen(path: string, mode: string): Ptr;
  fclose(stream: Ptr): number;
}

/** ucp_err_handler_cb_t: (arg, ep, status). */
const ErrHandlerProto = koffi.proto("void ucp_err_handler_cb(void *arg, void *ep, int status)");

/**
 * UCX settings this process needs before libucs/libucm load (they read them once, at load), set
 * only where the environment does not already say otherwise:
 * - UCM's memory hooks patch libc's mmap/munmap and redirect malloc while V8's threads allocate;
 *   with them on we saw the heap corrupted and the process deadlock in malloc. This transport
 *   registers one arena that lives as long as the process and passes its memh with every
 *   operation, so it needs no registration cache and no memory events.
 * - UCX's SIGSEGV/SIGBUS handlers would replace V8's (WebAssembly bounds checks rely on them).
 */
export const UCX_PROCESS_DEFAULTS: Record<string, string> = {
  UCX_MEM_EVENTS: "n",
  UCX_MEM_MALLOC_HOOKS: "n",
  UCX_MEM_MMAP_HOOK_MODE: "none",
  UCX_ERROR_SIGNALS: "",
};

function quietUcxProcessHooks(libc: LibraryHandle): void {
  const setenv = libc.func("int setenv(const char *name, const char *value, int overwrite)");
  for (const [name, value] of Object.entries(UCX_PROCESS_DEFAULTS)) setenv(name, value, 0);
}

let loaded: RawUcp | undefined;
let loadError: Error | undefined;

function load(): RawUcp {
  if (loaded) return loaded;
  if (loadError) throw loadError;
  let ucp: LibraryHandle;
  let ucs: LibraryHandle;
  let libc: LibraryHandle;
  try {
    libc = koffi.load("libc.so.6");
    quietUcxProcessHooks(libc);
    ucp = koffi.load("libucp.so.0");
    ucs = koffi.load("libucs.so.0");
  } catch (e) {
    loadError = new TransportError(
      `cannot load UCX (libucp.so.0): ${(e as Error).message}. Install UCX 1.13 or newer (Debian/Ubuntu: apt-get install libucx0).`,
      "TRANSPORT_ERROR",
      { cause: e },
    );
    throw loadError;
  }
  // Pointers that the caller computes (arena base + offset) travel as intptr_t numbers; UCX handles
  // (context, worker, endpoint, rkey, memh) stay opaque koffi pointers.
  loaded = {
    getVersionString: ucp.func("const char *ucp_get_version_string(void)"),
    configRead: ucp.func("int ucp_config_read(const char *env_prefix, const char *filename, _Out_ void **config)"),
    configModify: ucp.func("int ucp_config_modify(void *config, const char *name, const char *value)"),
    configRelease: ucp.func("void ucp_config_release(void *config)"),
    initVersion: ucp.func("int ucp_init_version(unsigned int api_major, unsigned int api_minor, void *params, void *config, _Out_ void **ctx)"),
    cleanup: ucp.func("void ucp_cleanup(void *ctx)"),
    contextPrintInfo: ucp.func("void ucp_context_print_info(void *ctx, void *stream)"),
    workerCreate: ucp.func("int ucp_worker_create(void *ctx, void *params, _Out_ void **worker)"),
    workerDestroy: ucp.func("void ucp_worker_destroy(void *worker)"),
    workerGetAddress: ucp.func("int ucp_worker_get_address(void *worker, _Out_ void **address, _Out_ size_t *length)"),
    workerReleaseAddress: ucp.func("void ucp_worker_release_address(void *worker, void *address)"),
    workerPrintInfo: ucp.func("void ucp_worker_print_info(void *worker, void *stream)"),
    workerProgress: ucp.func("unsigned int ucp_worker_progress(void *worker)"),
    workerGetEfd: ucp.func("int ucp_worker_get_efd(void *worker, _Out_ int *fd)"),
    workerArm: ucp.func("int ucp_worker_arm(void *worker)"),
    memMap: ucp.func("int ucp_mem_map(void *ctx, void *params, _Out_ void **memh)"),
    memUnmap: ucp.func("int ucp_mem_unmap(void *ctx, void *memh)"),
    memQuery: ucp.func("int ucp_mem_query(void *memh, void *attr)"),
    rkeyPack: ucp.func("int ucp_rkey_pack(void *ctx, void *memh, _Out_ void **rkey_buffer, _Out_ size_t *size)"),
    rkeyBufferRelease: ucp.func("void ucp_rkey_buffer_release(void *rkey_buffer)"),
    epCreate: ucp.func("int ucp_ep_create(void *worker, void *params, _Out_ void **ep)"),
    epCloseNbx: ucp.func("intptr_t ucp_ep_close_nbx(void *ep, void *param)"),
    epRkeyUnpack: ucp.func("int ucp_ep_rkey_unpack(void *ep, void *rkey_buffer, _Out_ void **rkey)"),
    rkeyDestroy: ucp.func("void ucp_rkey_destroy(void *rkey)"),
    getNbx: ucp.func("intptr_t ucp_get_nbx(void *ep, intptr_t buffer, size_t count, uint64_t remote_addr, void *rkey, void *param)"),
    putNbx: ucp.func("intptr_t ucp_put_nbx(void *ep, intptr_t buffer, size_t count, uint64_t remote_addr, void *rkey, void *param)"),
    requestCheckStatus: ucp.func("int ucp_request_check_status(intptr_t request)"),
    requestFree: ucp.func("void ucp_request_free(intptr_t request)"),
    statusString: ucs.func("const char *ucs_status_string(int status)"),
    pointerOf: libc.func("void *memcpy(intptr_t dest, intptr_t src, size_t n)"),
    schedYield: libc.func("int sched_yield(void)"),
    poll: libc.func("int poll(void *fds, unsigned long nfds, int timeout)"),
    eventfd: libc.func("int eventfd(unsigned int initval, int flags)"),
    write: libc.func("intptr_t write(int fd, void *buf, size_t n)"),
    read: libc.func("intptr_t read(int fd, void *buf, size_t n)"),
    close: libc.func("int close(int fd)"),
    fopen: libc.func("void *fopen(const char *path, const char *mode)"),
    fclose: libc.func("int fclose(void *stream)"),
  } as unknown as RawUcp;
  return loaded;
}

/** A UCX call that did not return UCS_OK, as a TransportError naming the call and the status. */
export class UcxStatusError extends TransportError {
  readonly status: number;
  constructor(call: string, status: number, hint = "") {
    super(`UCX ${call} failed: ${statusText(status)} (${status})${hint ? `; ${hint}` : ""}`);
    this.status = status;
  }
}

/** Human text of a ucs_status_t. */
export function statusText(status: number): string {
  try {
    return load().statusString(status);
  } catch {
    return `status ${status}`;
  }
}

function check(call: string, status: number, hint?: string): void {
  if (status !== UCS_OK) throw new UcxStatusError(call, status, hint);
}

/** ucs_status_ptr_t decoding: a request pointer, an immediate success (0) or an error (-1..-255). */
function isErrorPtr(v: number): boolean {
  return v < 0 && v >= -1000;
}

/** The UCX library version, e.g. "1.13.1". Throws TransportError when libucp is missing. */
export function ucxVersion(): string {
  return load().getVersionString();
}

/** A libc pointer object for an absolute address (so koffi.view can map arena memory). */
export function pointerAt(address: number): unknown {
  return load().pointerOf(address, 0, 0);
}

/** Writes what `print` prints to a FILE* into a string (via a temporary file). */
export function captureStream(print: (stream: unknown) => void, tmpPath: string): void {
  const lib = load();
  const stream = lib.fopen(tmpPath, "w");
  if (!stream) throw new TransportError(`cannot open ${tmpPath} to capture UCX output`);
  try {
    print(stream);
  } finally {
    lib.fclose(stream);
  }
}

export interface UcpContextOptions {
  /** UCX_TLS for this context only (ucp_config_modify); undefined keeps the environment's choice. */
  tls?: string;
  /** Extra UCX configuration pairs (name without the UCX_ prefix -> value). */
  config?: Record<string, string>;
  wakeup: boolean;
}

/** One UCX context with one worker. Every method is synchronous and must run on one thread. */
export class UcpWorker {
  readonly lib: RawUcp;
  readonly context: unknown;
  readonly worker: unknown;
  private closed = false;

  constructor(options: UcpContextOptions) {
    this.lib = load();
    const lib = this.lib;
    const cfg: Ptr[] = [null];
    check("ucp_config_read", lib.configRead(null, null, cfg), "check the UCX_* environment variables");
    const ctxOut: Ptr[] = [null];
    try {
      const pairs = { ...(options.config ?? {}), ...(options.tls !== undefined ? { TLS: options.tls } : {}) };
      for (const [name, value] of Object.entries(pairs)) {
        check(`ucp_config_modify(${name}=${value})`, lib.configModify(cfg[0], name, value), "that UCX setting is not accepted");
      }
      const params = Buffer.alloc(SIZEOF_UCP_PARAMS);
      params.writeBigUInt64LE(UCP_PARAM_FIELD_FEATURES, 0);
      params.writeBigUInt64LE(UCP_FEATURE_RMA | (options.wakeup ? UCP_FEATURE_WAKEUP : 0n), 8);
      check("ucp_init", lib.initVersion(1, 13, params, cfg[0], ctxOut), "is UCX_TLS naming transports this host has? (ucx_info -d)");
    } finally {
      lib.configRelease(cfg[0]);
    }
    this.context = ctxOut[0];
    const wOut: Ptr[] = [null];
    const status = lib.workerCreate(this.context, Buffer.alloc(SIZEOF_UCP_WORKER_PARAMS), wOut);
    if (status !== UCS_OK) {
      lib.cleanup(this.context);
      throw new UcxStatusError("ucp_worker_create", status);
    }
    this.worker = wOut[0];
  }

  /** The packed worker address peers connect to (bytes). */
  address(): Uint8Array {
    const out: Ptr[] = [null];
    const len = [0];
    check("ucp_worker_get_address", this.lib.workerGetAddress(this.worker, out, len));
    const bytes = new Uint8Array(koffi.view(out[0], Number(len[0])).slice(0));
    this.lib.workerReleaseAddress(this.worker, out[0]);
    return bytes;
  }

  /** The worker's event fd (only with wakeup). */
  eventFd(): number {
    const fd = [0];
    check("ucp_worker_get_efd", this.lib.workerGetEfd(this.worker, fd));
    return fd[0];
  }

  progress(): number {
    return this.lib.workerProgress(this.worker);
  }

  /** ucp_worker_arm: UCS_OK when it is safe to sleep on the event fd, UCS_ERR_BUSY when not. */
  arm(): number {
    return this.lib.workerArm(this.worker);
  }

  /** Allocates and registers `bytes` through UCX (ALLOCATE, so shared-memory transports can map it). */
  allocate(bytes: number): RegisteredMemory {
    const params = Buffer.alloc(SIZEOF_UCP_MEM_MAP_PARAMS);
    params.writeBigUInt64LE(UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS, 0);
    params.writeBigUInt64LE(0n, 8);
    params.writeBigUInt64LE(BigInt(bytes), 16);
    params.writeUInt32LE(UCP_MEM_MAP_ALLOCATE, 24);
    const out: Ptr[] = [null];
    check("ucp_mem_map", this.lib.memMap(this.context, params, out), `could not allocate ${bytes} bytes; lower AIRM_KV_UCX_POOL_MB`);
    const memh = out[0];
    const attr = Buffer.alloc(SIZEOF_UCP_MEM_ATTR);
    attr.writeBigUInt64LE(UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH, 0);
    check("ucp_mem_query", this.lib.memQuery(memh, attr));
    const base = Number(attr.readBigUInt64LE(8));
    const length = Number(attr.readBigUInt64LE(16));
    const rOut: Ptr[] = [null];
    const rLen = [0];
    check("ucp_rkey_pack", this.lib.rkeyPack(this.context, memh, rOut, rLen));
    const rkey = new Uint8Array(koffi.view(rOut[0], Number(rLen[0])).slice(0));
    this.lib.rkeyBufferRelease(rOut[0]);
    return { memh, base, length, rkey };
  }

  unmap(mem: RegisteredMemory): void {
    this.lib.memUnmap(this.context, mem.memh);
  }

  private errHandler: bigint | undefined;

  /**
   * Calls `onError(ep, status)` (from inside progress()) when an endpoint created in PEER mode
   * fails. Without it UCX logs each failure as unhandled.
   */
  onEndpointError(onError: (ep: unknown, status: number) => void): void {
    this.errHandler = koffi.register((_arg: unknown, ep: unknown, status: number) => onError(ep, status), koffi.pointer(ErrHandlerProto));
  }

  /** Connects to a peer's worker address. Throws UcxStatusError (e.g. unreachable). */
  connect(address: Uint8Array, errMode: number): unknown {
    const addrMem = koffi.alloc("uint8_t", address.byteLength);
    koffi.encode(addrMem, "uint8_t", Array.from(address), address.byteLength);
    const params = Buffer.alloc(SIZEOF_UCP_EP_PARAMS);
    const withHandler = errMode === UCP_ERR_HANDLING_MODE_PEER && this.errHandler !== undefined;
    params.writeBigUInt64LE(UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | (withHandler ? UCP_EP_PARAM_FIELD_ERR_HANDLER : 0n), 0);
    params.writeBigUInt64LE(koffi.address(addrMem), 8);
    params.writeUInt32LE(errMode, 16);
    if (withHandler) params.writeBigUInt64LE(koffi.address(this.errHandler), 24);
    const out: Ptr[] = [null];
    try {
      check("ucp_ep_create", this.lib.epCreate(this.worker, params, out), "the producer's worker is not reachable with this UCX_TLS");
    } finally {
      koffi.free(addrMem);
    }
    return out[0];
  }

  /** Starts a forced close; returns a request to wait on (0 when done at once). */
  closeEndpoint(ep: unknown): number {
    const param = Buffer.alloc(SIZEOF_UCP_REQUEST_PARAM);
    param.writeUInt32LE(UCP_OP_ATTR_FIELD_FLAGS, 0);
    param.writeUInt32LE(UCP_EP_CLOSE_FLAG_FORCE, 4);
    const r = this.lib.epCloseNbx(ep, param);
    return isErrorPtr(r) ? 0 : r;
  }

  unpackRkey(ep: unknown, packed: Uint8Array): unknown {
    const out: Ptr[] = [null];
    check(
      "ucp_ep_rkey_unpack",
      this.lib.epRkeyUnpack(ep, Buffer.from(packed.buffer, packed.byteOffset, packed.byteLength), out),
      "the descriptor's rkey is corrupt or from another UCX version",
    );
    return out[0];
  }

  destroyRkey(rkey: unknown): void {
    this.lib.rkeyDestroy(rkey);
  }

  /**
   * ucp_get_nbx of `length` bytes from (remoteAddr, rkey) into local address `local` (registered
   * through `memh`). Returns 0 when complete at once, a request handle to poll, or throws.
   */
  get(ep: unknown, local: number, length: number, remoteAddr: number, rkey: unknown, memh?: unknown): number {
    return this.rma("ucp_get_nbx", this.lib.getNbx, ep, local, length, remoteAddr, rkey, memh);
  }

  /** ucp_put_nbx, same conventions as get(). */
  put(ep: unknown, local: number, length: number, remoteAddr: number, rkey: unknown, memh?: unknown): number {
    return this.rma("ucp_put_nbx", this.lib.putNbx, ep, local, length, remoteAddr, rkey, memh);
  }

  private rma(call: string, fn: RawUcp["getNbx"], ep: unknown, local: number, length: number, remoteAddr: number, rkey: unknown, memh?: unknown): number {
    const param = Buffer.alloc(SIZEOF_UCP_REQUEST_PARAM);
    if (memh) {
      param.writeUInt32LE(UCP_OP_ATTR_FIELD_MEMH, 0);
      param.writeBigUInt64LE(koffi.address(memh), 64);
    }
    const r = fn(ep, local, length, remoteAddr, rkey, param);
    if (isErrorPtr(r)) throw new UcxStatusError(call, r);
    return r;
  }

  /** UCS_INPROGRESS while running, else the final status (the request is then freed). */
  poll(request: number): number {
    const s = this.lib.requestCheckStatus(request);
    if (s !== UCS_INPROGRESS) this.lib.requestFree(request);
    return s;
  }

  printContextInfo(stream: unknown): void {
    this.lib.contextPrintInfo(this.context, stream);
  }

  printWorkerInfo(stream: unknown): void {
    this.lib.workerPrintInfo(this.worker, stream);
  }

  destroy(): void {
    if (this.closed) return;
    this.closed = true;
    this.lib.workerDestroy(this.worker);
    this.lib.cleanup(this.context);
    if (this.errHandler !== undefined) koffi.unregister(this.errHandler);
  }
}

export interface RegisteredMemory {
  memh: unknown;
  /** Virtual address of the first byte. */
  base: number;
  length: number;
  /** Packed remote key peers use to reach this memory. */
  rkey: Uint8Array;
}

/** Sleeps until one of `fds` is readable or `timeoutMs` passes. Returns the fds that are readable. */
export function waitReadable(fds: number[], timeoutMs: number): number[] {
  const lib = load();
  const buf = Buffer.alloc(8 * fds.length);
  fds.forEach((fd, i) => {
    buf.writeInt32LE(fd, i * 8);
    buf.writeInt16LE(POLLIN, i * 8 + 4);
  });
  const n = lib.poll(buf, fds.length, timeoutMs);
  if (n <= 0) return [];
  return fds.filter((_, i) => (buf.readInt16LE(i * 8 + 6) & POLLIN) !== 0);
}

export function schedYield(): void {
  load().schedYield();
}

const EFD_NONBLOCK = 0o4000;
const EFD_CLOEXEC = 0o2000000;

/** A Linux eventfd one thread writes to wake another that sleeps in waitReadable(). */
export function createEventFd(): number {
  const fd = load().eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd < 0) throw new TransportError("eventfd() failed; cannot create the UCX progress thread's wake-up fd");
  return fd;
}

const ONE = (() => {
  const b = Buffer.alloc(8);
  b.writeBigUInt64LE(1n);
  return b;
})();

export function signalEventFd(fd: number): void {
  load().write(fd, ONE, 8);
}

export function drainEventFd(fd: number): void {
  load().read(fd, Buffer.alloc(8), 8);
}

export function closeFd(fd: number): void {
  load().close(fd);
}
