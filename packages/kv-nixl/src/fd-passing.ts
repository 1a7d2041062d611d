// File descriptors handed to the host's NIXL agent over a unix socket with SCM_RIGHTS: the seed's
// agent owner must hold the ATOM DMA-BUF fds another process allocated. libc through koffi
// (socket, connect, sendmsg, read, memfd_create); the agent receives them with Python's
// socket.recv_fds and keeps them open after the sender closed its copies.

import koffi from "koffi";
import { TransportError, UnsupportedError } from "@airm/rm-core";

const AF_UNIX = 1;
const SOCK_STREAM = 1;
const SOL_SOCKET = 1;
const SCM_RIGHTS = 1;
const MFD_CLOEXEC = 1;

interface Lib {
  socket(domain: number, type: number, proto: number): number;
  connect(fd: number, addr: Buffer, len: number): number;
  sendmsg(fd: number, msg: unknown, flags: number): number;
  read(fd: number, buf: Buffer, n: number): number;
  close(fd: number): number;
  memfd_create(name: string, flags: number): number;
  ftruncate(fd: number, len: number): number;
  pwrite(fd: number, buf: Buffer, n: number, off: number): number;
  strerror(e: number): string;
}
let lib: Lib | undefined;
function libc(): Lib {
  if (lib) return lib;
  if (process.platform !== "linux") throw new UnsupportedError(`passing file descriptors with SCM_RIGHTS needs Linux; this is ${process.platform}`);
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
  lib = {
    socket: l.func("int socket(int, int, int)"),
    connect: l.func("int connect(int, const void *addr, uint32_t len)"),
    sendmsg: l.func("intptr_t sendmsg(int, const airm_msghdr *msg, int)"),
    read: l.func("intptr_t read(int, _Out_ void *buf, size_t n)"),
    close: l.func("int close(int)"),
    memfd_create: l.func("int memfd_create(const char *name, unsigned int flags)"),
    ftruncate: l.func("int ftruncate(int, int64_t)"),
    pwrite: l.func("intptr_t pwrite(int, const void *buf, size_t n, int64_t off)"),
    strerror: l.func("const char *strerror(int)"),
  } as Lib;
  return lib;
}

const fail = (call: string): TransportError => new TransportError(`nixl: ${call} failed: ${libc().strerror(koffi.errno())}`);

/** A memfd of `bytes` bytes holding `data` at offset 0 (what a DMA-BUF exporter hands out, in host memory). */
export function memfdWith(name: string, data: Uint8Array, bytes = data.byteLength): number {
  const c = libc();
  const fd = c.memfd_create(name, MFD_CLOEXEC);
  if (fd < 0) throw fail("memfd_create");
  if (c.ftruncate(fd, bytes) !== 0 || c.pwrite(fd, Buffer.from(data.buffer, data.byteOffset, data.byteLength), data.byteLength, 0) !== data.byteLength) {
    c.close(fd);
    throw fail("writing the memfd");
  }
  return fd;
}

export function closeFd(fd: number): void {
  libc().close(fd);
}

/**
 * Sends `fds` with a JSON header over the unix socket at `path` (SCM_RIGHTS) and returns the
 * agent's one-line JSON answer. The caller may close its fds afterwards; the agent holds its own.
 */
export function sendFds(path: string, fds: number[], header: Record<string, unknown>): Record<string, unknown> {
  const c = libc();
  const sock = c.socket(AF_UNIX, SOCK_STREAM, 0);
  if (sock < 0) throw fail("socket(AF_UNIX)");
  try {
    const addr = Buffer.alloc(110);
    addr.writeUInt16LE(AF_UNIX, 0);
    if (Buffer.byteLength(path) > 107) throw new TransportError(`nixl: the agent's socket path is too long for AF_UNIX: ${path}`);
    addr.write(path, 2);
    if (c.connect(sock, addr, 2 + Buffer.byteLength(path) + 1) !== 0) throw fail(`connect(${path})`);
    const body = Buffer.from(`${JSON.stringify(header)}\n`);
    // one cmsghdr: len (size_t), level, type, then the fds, padded to 8 bytes
    const dataLen = 4 * fds.length;
    const control = Buffer.alloc(16 + Math.ceil(dataLen / 8) * 8);
    control.writeBigUInt64LE(BigInt(16 + dataLen), 0);
    control.writeInt32LE(SOL_SOCKET, 8);
    control.writeInt32LE(SCM_RIGHTS, 12);
    for (const [i, fd] of fds.entries()) control.writeInt32LE(fd, 16 + 4 * i);
    const msg = {
      msg_name: null,
      msg_namelen: 0,
      msg_iov: [{ iov_base: body, iov_len: body.length }],
      msg_iovlen: 1,
      msg_control: control,
      msg_controllen: control.length,
      msg_flags: 0,
    };
    if (c.sendmsg(sock, msg, 0) !== body.length) throw fail("sendmsg(SCM_RIGHTS)");
    let answer = "";
    const buf = Buffer.alloc(4096);
    while (!answer.includes("\n")) {
      const n = c.read(sock, buf, buf.length);
      if (n <= 0) throw new TransportError(`nixl: the agent closed the fd socket without an answer${n < 0 ? ` (${libc().strerror(koffi.errno())})` : ""}`);
      answer += buf.subarray(0, n).toString();
    }
    const r = JSON.parse(answer.slice(0, answer.indexOf("\n"))) as Record<string, unknown>;
    if (r.ok !== true) throw new TransportError(`nixl: the agent refused the fds: ${String(r.error)}`);
    return r;
  } finally {
    c.close(sock);
  }
}
