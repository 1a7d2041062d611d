// The few libc calls the shm transport needs that node:fs lacks: mmap/munmap of a whole file,
// posix_fallocate (reserve pages so a write through a mapping can never SIGBUS), hole punching
// (return pages of an idle slab) and flock (the liveness mark of a slab's owner, which works
// across PID namespaces). Bound lazily through koffi; knows nothing about keys or slabs.

import koffi from "koffi";
import { UnsupportedError } from "@airm/rm-core";

const PROT_READ = 1;
const PROT_WRITE = 2;
const MAP_SHARED = 0x01;
const MAP_POPULATE = 0x8000;
const LOCK_EX = 2;
const LOCK_NB = 4;
const FALLOC_FL_KEEP_SIZE = 1;
const FALLOC_FL_PUNCH_HOLE = 2;
export const ENOSPC = 28;
const EINTR = 4;
const EWOULDBLOCK = 11;

interface Libc {
  mmap(addr: null, len: number, prot: number, flags: number, fd: number, off: number): unknown;
  munmap(addr: unknown, len: number): number;
  posixFallocate(fd: number, off: number, len: number): number;
  fallocate(fd: number, mode: number, off: number, len: number): number;
  flock(fd: number, op: number): number;
  strerror(errnum: number): string;
}

let libc: Libc | undefined;

function bind(): Libc {
  if (libc) return libc;
  if (process.platform !== "linux") {
    throw new UnsupportedError(`the shm KV transport needs Linux (mmap, posix_fallocate, flock on /dev/shm); this is ${process.platform}`);
  }
  const lib = koffi.load("libc.so.6");
  libc = {
    mmap: lib.func("void *mmap(void *addr, size_t len, int prot, int flags, int fd, int64_t off)"),
    munmap: lib.func("int munmap(void *addr, size_t len)"),
    posixFallocate: lib.func("int posix_fallocate(int fd, int64_t off, int64_t len)"),
    fallocate: lib.func("int fallocate(int fd, int mode, int64_t off, int64_t len)"),
    flock: lib.func("int flock(int fd, int op)"),
    strerror: lib.func("const char *strerror(int errnum)"),
  } as Libc;
  return libc;
}

/** A failed libc call; `errno` is the C error number. */
export class LibcError extends Error {
  readonly errno: number;
  constructor(call: string, errno: number) {
    super(`${call} failed: ${bind().strerror(errno)} (errno ${errno})`);
    this.errno = errno;
  }
}

/** A MAP_SHARED mapping of a whole file and the zero-copy ArrayBuffer over it. */
export interface Mapping {
  readonly address: unknown;
  readonly size: number;
  /** Valid until `unmap`; touching it afterwards crashes the process. */
  readonly bytes: ArrayBuffer;
}

/**
 * Maps `size` bytes of `fd` shared (read-write unless `readOnly`), pre-faulting every page.
 * The fd may be closed afterwards. Throws LibcError.
 */
export function mapShared(fd: number, size: number, readOnly = false): Mapping {
  const c = bind();
  const prot = readOnly ? PROT_READ : PROT_READ | PROT_WRITE;
  const address = c.mmap(null, size, prot, MAP_SHARED | MAP_POPULATE, fd, 0);
  const raw = koffi.address(address);
  if (raw === 0n || raw === 0xffffffffffffffffn || raw === -1n) throw new LibcError("mmap", koffi.errno());
  return { address, size, bytes: koffi.view(address, size) };
}

/** Unmaps a mapping. Every view over `m.bytes` must be unused from here on. */
export function unmap(m: Mapping): void {
  bind().munmap(m.address, m.size);
}

/**
 * Reserves [0, size) of `fd` in the filesystem (and extends the file to `size`), so later
 * writes through a mapping cannot hit ENOSPC. Returns 0 or the C error number (ENOSPC...).
 */
export function reserve(fd: number, size: number): number {
  const c = bind();
  for (;;) {
    const err = c.posixFallocate(fd, 0, size);
    if (err !== EINTR) return err;
  }
}

/** Gives the pages of [0, size) back to the filesystem; the file size and mappings stay (reads give zeros). */
export function punchHole(fd: number, size: number): void {
  const c = bind();
  if (c.fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, size) !== 0) throw new LibcError("fallocate(PUNCH_HOLE)", koffi.errno());
}

/**
 * Takes an exclusive flock on `fd` without waiting. True when taken, false when another open
 * file (in any process, this one included) holds it. Throws LibcError on other failures.
 */
export function tryLockExclusive(fd: number): boolean {
  const c = bind();
  for (;;) {
    if (c.flock(fd, LOCK_EX | LOCK_NB) === 0) return true;
    const e = koffi.errno();
    if (e === EWOULDBLOCK) return false;
    if (e !== EINTR) throw new LibcError("flock", e);
  }
}
