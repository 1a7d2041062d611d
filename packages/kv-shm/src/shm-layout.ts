// The on-disk layout of an shm root, shared by producers and consumers in any process:
//   <root>/slab-<pid>-<token>-<n>        slab files, flock-ed by their owner for its lifetime
//   <root>/.new-slab-...                 a slab being created (renamed once reserved and locked)
//   <root>/keys/<request-id>/<rest>      one symlink per blob; its target text is
//                                        "<slab-file>:<offset>:<length>"
// Also the sweep that removes what dead owners left behind. Allocation and mapping live in
// shm-transport.ts.

import { closeSync, constants, existsSync, openSync, readdirSync, readlinkSync, rmdirSync, statSync, unlinkSync } from "node:fs";
import { join } from "node:path";
import { TransportError } from "@airm/rm-core";
import { tryLockExclusive } from "./libc-shm.ts";

export const DEFAULT_SHM_ROOT = "/dev/shm/rngd_kv_cluster";
export const KEYS_DIR = "keys";
export const SLAB_PREFIX = "slab-";
export const NEW_SLAB_PREFIX = ".new-slab-";
/** A half-created slab older than this is a crash leftover, not a create in progress (ms). */
const NEW_SLAB_GRACE_MS = 10_000;

/** Where a blob lives: which slab file, where in it, how long. */
export interface BlobLocation {
  slab: string;
  offset: number;
  length: number;
}

const TARGET = /^(slab-[A-Za-z0-9-]+):(\d{1,16}):(\d{1,16})$/;

export function encodeTarget(loc: BlobLocation): string {
  return `${loc.slab}:${loc.offset}:${loc.length}`;
}

/** Parses a link target; null when it is not one this transport writes. */
export function parseTarget(text: string): BlobLocation | null {
  const m = TARGET.exec(text);
  if (!m) return null;
  return { slab: m[1], offset: Number(m[2]), length: Number(m[3]) };
}

/**
 * The link of a validated key: `keys/<request-id>/<rest with "/" as "+">`, or `keys/<id>/+`
 * for a key that is only a request id. "+" cannot occur in a key, so names never collide.
 */
export function linkPathOf(root: string, requestId: string, key: string): string {
  const rest = key.length > requestId.length ? key.slice(requestId.length + 1).replaceAll("/", "+") : "+";
  return join(root, KEYS_DIR, requestId, rest);
}

function codeOf(e: unknown): string | undefined {
  return (e as NodeJS.ErrnoException | undefined)?.code;
}

function ignoreMissing(fn: () => void): void {
  try {
    fn();
  } catch (e) {
    if (codeOf(e) !== "ENOENT") throw e;
  }
}

export interface SweepResult {
  slabs: number;
  links: number;
}

/**
 * Removes slabs whose owner is gone (nobody holds their flock) and links that point at a slab
 * that no longer exists, then empty request folders. Safe while live producers and consumers
 * use the root. Throws TransportError when the root cannot be read.
 */
export function sweepLeftovers(root: string, now = Date.now()): SweepResult {
  const result: SweepResult = { slabs: 0, links: 0 };
  let names: string[];
  try {
    names = readdirSync(root);
  } catch (e) {
    throw new TransportError(`cannot read the shm root ${root}: ${(e as Error).message}; check PD_SHM_ROOT and its permissions`, "TRANSPORT_ERROR", { cause: e });
  }
  for (const name of names) {
    const isNew = name.startsWith(NEW_SLAB_PREFIX);
    if (!isNew && !name.startsWith(SLAB_PREFIX)) continue;
    const file = join(root, name);
    let fd: number;
    try {
      fd = openSync(file, constants.O_RDONLY | constants.O_NOFOLLOW);
    } catch {
      continue; // vanished or not ours to read
    }
    try {
      if (!tryLockExclusive(fd)) continue; // its owner is alive
      if (isNew && now - statSync(file).mtimeMs < NEW_SLAB_GRACE_MS) continue;
      ignoreMissing(() => unlinkSync(file));
      result.slabs++;
    } finally {
      closeSync(fd);
    }
  }
  const keysRoot = join(root, KEYS_DIR);
  let requests: string[] = [];
  try {
    requests = readdirSync(keysRoot);
  } catch (e) {
    if (codeOf(e) !== "ENOENT") throw new TransportError(`cannot read ${keysRoot}: ${(e as Error).message}`, "TRANSPORT_ERROR", { cause: e });
  }
  for (const rid of requests) {
    const dir = join(keysRoot, rid);
    let links: string[];
    try {
      links = readdirSync(dir);
    } catch {
      continue;
    }
    for (const link of links) {
      const path = join(dir, link);
      let target: string;
      try {
        target = readlinkSync(path);
      } catch {
        continue;
      }
      const loc = parseTarget(target);
      if (loc && existsSync(join(root, loc.slab))) continue;
      ignoreMissing(() => unlinkSync(path));
      result.links++;
    }
    try {
      rmdirSync(dir);
    } catch {
      // not empty (live blobs) or already gone
    }
  }
  return result;
}
