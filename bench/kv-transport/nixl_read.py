"""NIXL alone, the reference of `pnpm bench kv-transport --transport nixl`: two agents in one
process (UCX backend, default UCX configuration), each with its own /dev/shm file registered as
DRAM, and the second READs the first's 64 x 1 MiB (one transfer of 64 descriptors, as one
request), `reps` times. Prints one JSON line: the milliseconds of every READ and whether the bytes
arrived equal.

Without progress threads by default, as the sidecar's agent runs (the loop below progresses both
agents); `progress-thread` as the 4th argument keeps the wheel's default, a progress thread per
agent that polls without a pause (each spins a core)."""

import ctypes, json, mmap, os, sys, time

from nixl._api import nixl_agent, nixl_agent_config

blobs, blob, reps = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
threads = len(sys.argv) > 4 and sys.argv[4] == "progress-thread"
size = blobs * blob


def arena(tag):
    path = f"/dev/shm/airm-bench-nixl-{os.getpid()}-{tag}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.ftruncate(fd, size)
    mm = mmap.mmap(fd, size)
    os.unlink(path)
    return mm, ctypes.addressof(ctypes.c_char.from_buffer(mm))


src_mm, src = arena("src")
dst_mm, dst = arena("dst")
src_mm[:] = os.urandom(size)
a = nixl_agent(f"ref-src-{os.getpid()}", nixl_agent_config(enable_prog_thread=threads, backends=["UCX"]))
b = nixl_agent(f"ref-dst-{os.getpid()}", nixl_agent_config(enable_prog_thread=threads, backends=["UCX"]))
a.register_memory([(src, size, 0, "")], "DRAM")
b.register_memory([(dst, size, 0, "")], "DRAM")
remote = b.add_remote_agent(a.get_agent_metadata())
remote = remote.decode() if isinstance(remote, bytes) else remote
src_d = b.get_xfer_descs([(src + i * blob, blob, 0) for i in range(blobs)], "DRAM")
dst_d = b.get_xfer_descs([(dst + i * blob, blob, 0) for i in range(blobs)], "DRAM")
ms = []
for r in range(reps + 1):
    dst_mm[0:blob] = bytes(blob)
    t0 = time.perf_counter()
    h = b.initialize_xfer("READ", dst_d, src_d, remote)
    st = b.transfer(h)
    while st == "PROC":
        st = b.check_xfer_state(h)
        a.get_new_notifs()  # progresses the source agent too (when it has no progress thread)
    t1 = time.perf_counter()
    b.release_xfer_handle(h)
    if st != "DONE":
        raise SystemExit(f"READ ended {st}")
    if r > 0:
        ms.append((t1 - t0) * 1000)
print(json.dumps({"ms": ms, "equal": src_mm[:] == dst_mm[:]}), flush=True)
# The wheel's libraries can crash in their exit handlers after the work is done (the seed saw the
# same); leave without running them.
os._exit(0)
