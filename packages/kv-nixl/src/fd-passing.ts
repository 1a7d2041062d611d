// File descriptors handed to the host's NIXL agent over a unix socket with SCM_RIGHTS: the seed's
// agent owner must hold the ATOM DMA-BUF fds another process allocated. libc through koffi
// (socket, connect, sendmsg, read, memfd_create); the agent receives them with Python's
// socket.recv_fds and keeps them open after the sender closed its copies.

import koffi from "koffi";
import { TransportError } from "@airm/rm-core";
import { libc, libcFailure } from "./libc.ts";

const AF_UNIX = 1;
const SOCK_STREAM = 1;
const SOL_SOCKET = 1;
const SCM_RIGHTS = 1;
const MFD_CLOEXEC = 1;

/** A memfd of `bytes` bytes holding `data` at offset 0 (what a DMA-BUF exporter hands out, in host memory). */
export function memfdWith(name: string, data: Uint8Array, bytes = data.byteLength): number {
  const c = libc();
  const fd = c.memfdCreate(name, MFD_CLOEXEC);
  if (fd < 0) throw libcFailure("memfd_create");
  if (c.ftruncate(fd, bytes) !== 0 || c.pwrite(fd, Buffer.from(data.buffer, data.byteOffset, data.byteLength), data.byteLength, 0) !== data.byteLength) {
    c.close(fd);
    throw libcFailure("writing the memfd");
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
  if (sock < 0) throw libcFailure("socket(AF_UNIX)");
  try {
    const addr = Buffer.alloc(110);
    addr.writeUInt16LE(AF_UNIX, 0);
    if (Buffer.byteLength(path) > 107) throw new TransportError(`nixl: the agent's socket path is too long for AF_UNIX: ${path}`);
    addr.write(path, 2);
    if (c.connect(sock, addr, 2 + Buffer.byteLength(path) + 1) !== 0) throw libcFailure(`connect(${path})`);
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
    if (c.sendmsg(sock, msg, 0) !== body.length) throw libcFailure("sendmsg(SCM_RIGHTS)");
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
