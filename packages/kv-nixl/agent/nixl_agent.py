#!/usr/bin/env python3
"""The NIXL agent of one host, driven by the kv-nixl sidecar over stdin/stdout.

One JSON object per line each way. A request {"id": n, "op": ..., ...} gets exactly one reply
{"id": n, "ok": true, ...} or {"id": n, "ok": false, "error": "..."}; a transfer that completes
later is reported as {"event": "xfer", "xfer": x, "state": "DONE"|"ERR", "error"?}. Bytes never
cross this channel: the agent registers shared-memory arenas (files the workers map) as DRAM and
moves bytes between them with NIXL READs. Every NIXL call is made on this one thread.
"""

import base64
import ctypes
import json
import mmap
import os
import select
import signal
import socket
import sys
import time
import zlib

# The protocol owns the original stdout; anything else that prints (NIXL's own logging, UCX)
# goes to stderr, which the sidecar keeps for error messages.
_proto = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)
sys.stdout = sys.stderr

try:
    import nixl._api as nixl_api
    from nixl._api import nixl_agent, nixl_agent_config
except Exception as e:  # the wheels are missing or do not load: say so and stop
    _proto.write(json.dumps({"event": "fatal", "error": f"cannot import nixl: {e}"}) + "\n")
    _proto.flush()
    sys.exit(3)


def out(obj):
    _proto.write(json.dumps(obj) + "\n")
    _proto.flush()


def _with_progress_delay(delay_us):
    """Makes the wheel create its agent with `delay_us` between progress polls (it hard-codes 0)."""
    real = nixl_api.nixlBind.nixlAgent

    def make(name, cfg):
        cfg.pthrDelay = delay_us
        return real(name, cfg)

    nixl_api.nixlBind.nixlAgent = make


class Agent:
    def __init__(self, name, backends, progress_us=-1):
        self.name = name
        # Same host only (progress_us < 0): no progress thread. The wheel runs it with no delay
        # between polls, so it spins a whole core for as long as the agent lives (half of a 2-core
        # machine); this loop drives progress itself (check_xfer_state) while transfers are in
        # flight and sleeps in select() otherwise.
        # Across hosts (progress_us >= 0): the agents of other hosts READ from this one's arenas
        # while it has nothing in flight, and over UCX's TCP transport a READ is served by the
        # target's progress. The progress thread then runs with `progress_us` as its poll timeout:
        # it sleeps on UCX's event fd and wakes when a peer's request arrives (measured: ~0 CPU
        # idle, 64 MiB read by a peer in 70-110 ms over loopback TCP).
        if progress_us >= 0:
            _with_progress_delay(progress_us)
        self.nixl = nixl_agent(name, nixl_agent_config(enable_prog_thread=progress_us >= 0, backends=backends))
        self.backends = backends
        self.arenas = {}  # id -> (mmap, fd, base, size, reg descs)
        self.remotes = set()
        self.xfers = {}  # id -> (handle, started)
        self.next_arena = 1
        self.held_fds = {}  # tag -> [fd, ...]: descriptors handed over with SCM_RIGHTS
        self.fd_path = None
        self.fd_sock = None

    # --- file descriptors handed over (SCM_RIGHTS) ------------------------------------------------
    def listen_fds(self, path):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(path)
        os.chmod(path, 0o600)
        s.listen(16)
        self.fd_path, self.fd_sock = path, s

    def accept_fds(self):
        conn, _ = self.fd_sock.accept()
        with conn:
            conn.settimeout(5)
            try:
                msg, fds, _flags, _addr = socket.recv_fds(conn, 65536, 16)
                header = json.loads(msg.split(b"\n", 1)[0])
                tag = str(header["tag"])
                if not fds:
                    raise ValueError("no file descriptor came with the message (SCM_RIGHTS)")
                # what the agent sees through its own descriptors: size and CRC-32 of the first `check` bytes
                seen = []
                for fd in fds:
                    size = os.fstat(fd).st_size
                    n = min(int(header.get("check", 0)), size)
                    crc = 0
                    if n > 0:
                        with mmap.mmap(fd, n, mmap.MAP_SHARED, mmap.PROT_READ) as m:
                            crc = zlib.crc32(m[:n])
                    seen.append({"bytes": size, "crc32": crc})
                for fd in self.held_fds.pop(tag, []):
                    os.close(fd)
                self.held_fds[tag] = fds
                conn.sendall((json.dumps({"ok": True, "tag": tag, "fds": seen}) + "\n").encode())
            except Exception as e:
                conn.sendall((json.dumps({"ok": False, "error": f"{type(e).__name__}: {e}"}) + "\n").encode())

    def held(self, req):
        return {"held": {t: len(f) for t, f in self.held_fds.items()}}

    def drop_fds(self, req):
        fds = self.held_fds.pop(str(req["tag"]), [])
        for fd in fds:
            os.close(fd)
        return {"dropped": len(fds)}

    # --- requests -------------------------------------------------------------------------------
    def hello(self, req):
        return {"agent": self.name, "plugins": sorted(self.nixl.get_plugin_list()), "backends": self.backends, "pid": os.getpid()}

    def register(self, req):
        path, size = req["path"], int(req["bytes"])
        fd = os.open(path, os.O_RDWR)
        try:
            if os.fstat(fd).st_size < size:
                raise ValueError(f"{path} holds {os.fstat(fd).st_size} bytes, fewer than the {size} to register")
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except Exception:
            os.close(fd)
            raise
        base = ctypes.addressof(ctypes.c_char.from_buffer(mm))
        reg = self.nixl.register_memory([(base, size, 0, "")], "DRAM")
        if reg is None:
            mm.close()
            os.close(fd)
            raise RuntimeError(f"NIXL refused to register {path} ({size} bytes) as DRAM")
        arena = self.next_arena
        self.next_arena += 1
        self.arenas[arena] = (mm, fd, base, size, reg)
        return {"arena": arena, "base": str(base)}

    def deregister(self, req):
        a = self.arenas.pop(int(req["arena"]), None)
        if a is None:
            return {"deregistered": False}
        mm, fd, _base, _size, reg = a
        self.nixl.deregister_memory(reg)
        try:
            mm.close()
        except BufferError:
            pass  # a ctypes view still points into it; the mapping goes with the process
        os.close(fd)
        return {"deregistered": True}

    def metadata(self, req):
        return {"agent": self.name, "metadata": base64.b64encode(self.nixl.get_agent_metadata()).decode()}

    def add_remote(self, req):
        name = self.nixl.add_remote_agent(base64.b64decode(req["metadata"]))
        name = name.decode() if isinstance(name, bytes) else str(name)
        self.remotes.add(name)
        return {"agent": name}

    def remove_remote(self, req):
        name = str(req["agent"])
        if name not in self.remotes:
            return {"removed": False}
        self.remotes.discard(name)
        self.nixl.remove_remote_agent(name)
        return {"removed": True}

    def read(self, req):
        """READ copies [(dst_addr, src_addr, len)] from `remote` (this agent's own name for a local copy)."""
        xid = int(req["xfer"])
        copies = req["copies"]
        dst = self.nixl.get_xfer_descs([(int(d), int(n), 0) for d, _s, n in copies], "DRAM")
        src = self.nixl.get_xfer_descs([(int(s), int(n), 0) for _d, s, n in copies], "DRAM")
        handle = self.nixl.initialize_xfer("READ", dst, src, req["remote"])
        if not handle:
            raise RuntimeError("NIXL could not create the transfer (initialize_xfer gave no handle)")
        state = self.nixl.transfer(handle)
        if state == "ERR":
            self.nixl.release_xfer_handle(handle)
            raise RuntimeError("NIXL refused to post the READ (transfer state ERR)")
        self.xfers[xid] = (handle, time.monotonic())
        return {"xfer": xid, "state": state}

    def cancel(self, req):
        x = self.xfers.pop(int(req["xfer"]), None)
        if x is not None:
            try:
                self.nixl.release_xfer_handle(x[0])
            except Exception:
                pass
        return {"cancelled": x is not None}

    # --- completions ----------------------------------------------------------------------------
    def poll(self):
        for xid, (handle, _t) in list(self.xfers.items()):
            try:
                state = self.nixl.check_xfer_state(handle)
            except Exception as e:
                state, err = "ERR", str(e)
            else:
                err = None
            if state == "PROC":
                continue
            del self.xfers[xid]
            try:
                self.nixl.release_xfer_handle(handle)
            except Exception:
                pass
            ev = {"event": "xfer", "xfer": xid, "state": "DONE" if state == "DONE" else "ERR"}
            if state != "DONE":
                ev["error"] = err or f"transfer state {state}"
            out(ev)


def serve(agent):
    ops = {"hello": agent.hello, "register": agent.register, "deregister": agent.deregister, "metadata": agent.metadata, "add_remote": agent.add_remote, "remove_remote": agent.remove_remote, "read": agent.read, "cancel": agent.cancel, "held": agent.held, "drop_fds": agent.drop_fds}
    stdin = sys.stdin.buffer
    buf = b""
    while True:
        # poll completions often while transfers are in flight, otherwise sleep until a request
        timeout = 0.0002 if agent.xfers else None
        watched = [stdin] + ([agent.fd_sock] if agent.fd_sock else [])
        ready, _, _ = select.select(watched, [], [], timeout)
        if agent.fd_sock in ready:
            agent.accept_fds()
        if stdin in ready:
            chunk = os.read(stdin.fileno(), 1 << 16)
            if not chunk:
                return  # the sidecar is gone
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                if not line.strip():
                    continue
                req = json.loads(line)
                try:
                    fn = ops.get(req.get("op"))
                    if fn is None:
                        raise ValueError(f"unknown op {req.get('op')!r}")
                    out({"id": req["id"], "ok": True, **fn(req)})
                except Exception as e:
                    out({"id": req.get("id"), "ok": False, "error": f"{type(e).__name__}: {e}"})
        agent.poll()


def main():
    name = sys.argv[1] if len(sys.argv) > 1 else f"airm-{os.uname().nodename}-{os.getpid()}"
    backends = (sys.argv[2] if len(sys.argv) > 2 else "UCX").split(",")
    progress_us = int(sys.argv[4]) if len(sys.argv) > 4 else -1
    agent = Agent(name, backends, progress_us)
    if len(sys.argv) > 3 and sys.argv[3]:
        agent.listen_fds(sys.argv[3])
    out({"event": "ready", **agent.hello({}), "fd_socket": agent.fd_path})
    # SIGTERM (the sidecar stopping) and the end of stdin (the sidecar gone) both leave through
    # here, so the fd socket never outlives the agent. os._exit skips the wheel's exit handlers,
    # which can crash after the work is done (the seed saw the same).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        serve(agent)
    finally:
        if agent.fd_path:
            try:
                os.unlink(agent.fd_path)
            except FileNotFoundError:
                pass
        os._exit(0)


if __name__ == "__main__":
    main()
