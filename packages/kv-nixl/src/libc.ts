// The libc calls the nixl transport makes that node:fs and node:net lack, bound once per process
// through koffi: mmap of a worker's arena (arena.ts), and the unix-socket hand-over of file
// descriptors with SCM_RIGHTS plus the memfds it is tested with (fd-passing.ts).

import koffi from "koffi";
import { TransportError, UnsupportedError } from "@airm/rm-core";

export interface Libc {
  mmap(addr: null, len: number, prot: number, flags: number, fd: number, off: number): unknown;
  munmap(addr: unknown, len: number): number;
  posixFallocate(fd: number, off: number, len: number): number;
  socket(domain: number, type: number, proto: number): number;
  connect(fd: number, addr: Buffer, len: number): number;
  sendmsg(fd: number, msg: unknown, flags: number): number;
  read(fd: number, buf: Buffer, n: number): number;
  close(fd: number): number;
  memfdCreate(name: string, flags: number): number;
  ftruncate(fd: number, len: number): number;
  pwrite(fd: number, buf: Buffer, n: number, off: number): number;
  strerror(e: number): string;
}

let bound: Libc | undefined;

export function libc(): Libc {
  if (bound) return bound;
  if (process.platform !== "linux") throw new UnsupportedError(`the nixl KV transport needs Linux (/dev/shm arenas, SCM_RIGHTS); this is ${process.platform}`);
  const l = koffi.load("libc.so.6");
  const iovec = koffi.struct("airm_iovec", { iov_base: "void *", iov_len: "size_t" });
  koffi.struct("airm_msghdr", {
    msg_name: "void *",
    msg_namelen: "uint32_t",
    msg_iov: koffi.pointer(iovec),
    msg_iovlen: "size_t",
    msg_control: "void *",
    msg_controllen: "size_t",
    msg_flags: "int",
  });
  bound = {
    mmap: l.func("void *mmap(void *addr, size_t len, int prot, int flags, int fd, int64_t off)"),
    munmap: l.func("int munmap(void *addr, size_t len)"),
    posixFallocate: l.func("int posix_fallocate(int fd, int64_t off, int64_t len)"),
    socket: l.func("int socket(int, int, int)"),
    connect: l.func("int connect(int, const void *addr, uint32_t len)"),
    sendmsg: l.func("intptr_t sendmsg(int, const airm_msghdr *msg, int)"),
    read: l.func("intptr_t read(int, _Out_ void *buf, size_t n)"),
    close: l.func("int close(int)"),
    memfdCreate: l.func("int memfd_create(const char *name, unsigned int flags)"),
    ftruncate: l.func("int ftruncate(int, int64_t)"),
    pwrite: l.func("intptr_t pwrite(int, const void *buf, size_t n, int64_t off)"),
    strerror: l.func("const char *strerror(int errnum)"),
  } as Libc;
  return bound;
}

/** A TransportError for a failed libc call, with errno's text. */
export function libcFailure(call: string, errno = koffi.errno()): TransportError {
  return new TransportError(`nixl: ${call} failed: ${libc().strerror(errno)}`);
}
