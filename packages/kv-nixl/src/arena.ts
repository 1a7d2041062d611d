// A worker's KV arena: a file in /dev/shm, its pages reserved up front (a write through the
// mapping can never SIGBUS on a full tmpfs), mapped shared into this process through koffi and
// registered with the host's NIXL agent by the sidecar, which maps the same file. Slots come
// from rm-core's RangeAllocator. Files of processes that are gone are swept at open.

import { closeSync, ftruncateSync, openSync, readdirSync, rmSync } from "node:fs";
import { join } from "node:path";
import { randomBytes } from "node:crypto";
import koffi from "koffi";
import { RangeAllocator, TransportError } from "@airm/rm-core";
import { libc, libcFailure } from "./libc.ts";

const PROT_READ = 1;
const PROT_WRITE = 2;
const MAP_SHARED = 0x01;
const EINTR = 4;

export const ARENA_PREFIX = "airm-nixl-";

const alive = (pid: number): boolean => {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === "EPERM";
  }
};

/** Removes arena files in `dir` whose creating process is gone. Returns how many. */
export function sweepArenas(dir = "/dev/shm"): number {
  let n = 0;
  for (const name of readdirSync(dir)) {
    const m = new RegExp(`^${ARENA_PREFIX}(\\d+)-`).exec(name);
    if (m && !alive(Number(m[1]))) {
      rmSync(join(dir, name), { force: true });
      n++;
    }
  }
  return n;
}

export class Arena {
  readonly path: string;
  readonly size: number;
  /** The whole arena, zero-copy over the shared mapping; valid until close(). */
  readonly bytes: Uint8Array;
  private readonly alloc: RangeAllocator;
  private readonly address: unknown;
  private closed = false;

  private constructor(path: string, size: number, address: unknown) {
    this.path = path;
    this.size = size;
    this.address = address;
    this.bytes = new Uint8Array(koffi.view(address, size));
    this.alloc = new RangeAllocator(size, 4096);
  }

  /** Creates, reserves and maps an arena of `size` bytes in `dir`. Throws TransportError (NO_SPACE when tmpfs is full). */
  static create(size: number, dir = "/dev/shm"): Arena {
    sweepArenas(dir);
    const path = join(dir, `${ARENA_PREFIX}${process.pid}-${randomBytes(4).toString("hex")}`);
    const fd = openSync(path, "wx+", 0o600);
    try {
      ftruncateSync(fd, size);
      let err: number;
      do err = libc().posixFallocate(fd, 0, size);
      while (err === EINTR);
      if (err !== 0) {
        throw new TransportError(
          `nixl: cannot reserve ${size} bytes for the KV arena ${path}: ${libc().strerror(err)}; lower AIRM_KV_NIXL_POOL_MB or free /dev/shm`,
          "TRANSPORT_NO_SPACE",
        );
      }
      const address = libc().mmap(null, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      const raw = koffi.address(address);
      if (raw === 0n || raw === 0xffffffffffffffffn) throw libcFailure(`mmap of the KV arena ${path}`);
      return new Arena(path, size, address);
    } catch (e) {
      rmSync(path, { force: true });
      throw e;
    } finally {
      closeSync(fd);
    }
  }

  /** A slot of `length` bytes (offset), or null when the arena is full. */
  allocate(length: number): number | null {
    const at = this.alloc.allocate(length);
    return at < 0 ? null : at;
  }

  free(offset: number): void {
    this.alloc.release(offset);
  }

  get usedBytes(): number {
    return this.alloc.allocatedBytes;
  }

  /** Unmaps and removes the file; every view over `bytes` must be unused from here on. */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    libc().munmap(this.address, this.size);
    rmSync(this.path, { force: true });
  }
}
