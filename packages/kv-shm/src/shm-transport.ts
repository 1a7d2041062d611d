// One endpoint of the shm KV transport. As a producer it owns a few slab files in the root,
// reserved with posix_fallocate and mapped once, hands out regions of them, copies a pushed blob
// in and publishes it with one symlink (atomic). As a consumer it reads the link, maps the
// named slab once (kept until close) and returns a view, or copies into the caller's buffer.
// Regions come back when their request's key folder is removed (release on either side) or the
// TTL passes. The file layout and the leftover sweep are in shm-layout.ts; libc calls in libc-shm.ts.

import { randomBytes } from "node:crypto";
import { closeSync, constants, fstatSync, lstatSync, mkdirSync, openSync, readlinkSync, renameSync, rmdirSync, rmSync, symlinkSync, unlinkSync } from "node:fs";
import { basename, dirname, join } from "node:path";
import {
  checkBlobSpec,
  hostStagingSupport,
  DEFAULT_PULL_TIMEOUT_MS,
  RangeAllocator,
  requestIdOf,
  TransportError,
  TransportTimeoutError,
  validateKey,
  validateRequestId,
  type KVTransport,
  type PulledBlob,
  type PullOptions,
  type PushOptions,
  type TransportStats,
  type TransportSupport,
} from "@airm/rm-core";
import { ENOSPC, LibcError, mapShared, punchHole, reserve, tryLockExclusive, unmap, type Mapping } from "./libc-shm.ts";
import { encodeTarget, KEYS_DIR, linkPathOf, NEW_SLAB_PREFIX, parseTarget, SLAB_PREFIX, sweepLeftovers } from "./shm-layout.ts";

export const SHM_SUPPORT: TransportSupport = hostStagingSupport(["same-host"]);

/** Resolved settings of one endpoint (see config.ts for where they come from). */
export interface ShmSettings {
  root: string;
  /** Blobs older than this are removed (ms). */
  ttlMs: number;
  /** Size of a new slab file (bytes); a larger blob gets a slab of its own size. */
  slabBytes: number;
}

/** An empty extra slab gives its pages back after staying empty this long (ms). */
const IDLE_SLAB_TRIM_MS = 10_000;
/** How often an open endpoint sweeps what dead endpoints left in the root (their slabs and links), besides at open. */
const SWEEP_EVERY_MS = 5_000;
/** Pull polling backoff: first and largest sleep (ms). */
const POLL_FIRST_MS = 1;
const POLL_MAX_MS = 5;
/** A slab created as a fallback under memory pressure is rounded to this (bytes). */
const TIGHT_SLAB_ROUND = 64 * 1024;
/** Every blob's region in a slab starts on this boundary (bytes); lengths are rounded up to it. */
const REGION_ALIGN = 64;

function alignUp(n: number, to: number): number {
  return Math.ceil(n / to) * to;
}

interface Slab {
  name: string;
  /** Kept open: it holds the flock that tells sweepers this slab's owner is alive. */
  fd: number;
  map: Mapping;
  /** The whole mapping as bytes, made once (copies go through `set(data, offset)`). */
  bytes: Uint8Array;
  regions: RangeAllocator;
  /** Pages given back with punchHole; must be reserved again before use. */
  trimmed: boolean;
  emptySince: number;
}

interface Blob {
  key: string;
  link: string;
  slab: Slab;
  offset: number;
  length: number;
  /** Inode of the request folder the link was made in; a different or missing folder means released. */
  dirIno: number;
}

interface RequestRecord {
  dir: string;
  /** Inode of the request folder as last made or seen by this endpoint; -1 when gone. */
  dirIno: number;
  blobs: Map<string, Blob>;
  lastPush: number;
}

interface ReadMapping {
  map: Mapping;
}

function errnoCode(e: unknown): string | undefined {
  return (e as NodeJS.ErrnoException | undefined)?.code;
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

function noSpace(root: string, bytes: number, detail: string): TransportError {
  return new TransportError(
    `no space in ${root} for a blob of ${bytes} bytes (${detail}); release finished requests, lower PD_SHM_TTL_S, or give /dev/shm more room`,
    "TRANSPORT_NO_SPACE",
  );
}

export class ShmTransport implements KVTransport {
  readonly name = "shm";
  readonly support = SHM_SUPPORT;
  readonly root: string;
  private readonly settings: ShmSettings;
  private readonly keysRoot: string;
  private readonly owner = `${process.pid}-${randomBytes(4).toString("hex")}`;
  private slabSeq = 0;
  private readonly slabs: Slab[] = [];
  private readonly requests = new Map<string, RequestRecord>();
  private readonly readMaps = new Map<string, ReadMapping>();
  private liveBlobs = 0;
  private liveBytes = 0;
  private expiredBlobs = 0;
  private closed = false;
  private sweptAt = Date.now();
  private readonly timer: NodeJS.Timeout;

  private constructor(settings: ShmSettings) {
    this.settings = settings;
    this.root = settings.root;
    this.keysRoot = join(settings.root, KEYS_DIR);
    const period = Math.min(1000, Math.max(20, settings.ttlMs / 4));
    this.timer = setInterval(() => this.maintain(), period);
    this.timer.unref();
  }

  /** Creates the root if needed, sweeps what dead owners left there, and opens an endpoint. Throws TransportError. */
  static open(settings: ShmSettings): ShmTransport {
    try {
      mkdirSync(join(settings.root, KEYS_DIR), { recursive: true });
    } catch (e) {
      throw new TransportError(`cannot create the shm root ${settings.root}: ${(e as Error).message}; set PD_SHM_ROOT to a writable tmpfs folder`, "TRANSPORT_ERROR", { cause: e });
    }
    sweepLeftovers(settings.root);
    return new ShmTransport(settings);
  }

  async push(key: string, data: Uint8Array, options: PushOptions = {}): Promise<void> {
    validateKey(key);
    checkBlobSpec(this, options);
    this.assertOpen("push");
    if (!(data instanceof Uint8Array)) throw new TransportError(`push ${key}: data must be a Uint8Array, got ${typeof data}`);
    const rid = requestIdOf(key);
    const length = data.byteLength;
    const deadline = Date.now() + Math.max(0, options.timeoutMs ?? 0);
    // A new request is the moment to take back what finished requests held: the freed regions
    // are the lowest ones again, so the bytes in use stay compact (warm in cache and page tables).
    if (!this.requests.has(rid)) this.reclaim(Date.now());
    let place = this.allocate(length);
    while (!place) {
      if (Date.now() >= deadline) throw noSpace(this.root, length, "every slab is full and no new slab could be reserved");
      await sleep(10);
      this.assertOpen("push");
      place = this.allocate(length);
    }
    const { slab, offset } = place;
    try {
      slab.bytes.set(data, offset);
      this.publish(rid, key, { key, link: linkPathOf(this.root, rid, key), slab, offset, length, dirIno: 0 });
    } catch (e) {
      this.freeRegion(slab, offset);
      throw e;
    }
  }

  async pull(key: string, options: PullOptions = {}): Promise<PulledBlob> {
    validateKey(key);
    checkBlobSpec(this, options);
    this.assertOpen("pull");
    const rid = requestIdOf(key);
    const link = linkPathOf(this.root, rid, key);
    const timeoutMs = options.timeoutMs ?? DEFAULT_PULL_TIMEOUT_MS;
    const deadline = Date.now() + timeoutMs;
    let wait = POLL_FIRST_MS;
    for (;;) {
      let target: string | undefined;
      try {
        target = readlinkSync(link);
      } catch (e) {
        const code = errnoCode(e);
        if (code !== "ENOENT" && code !== "ENOTDIR") throw new TransportError(`pull ${key}: cannot read ${link}: ${(e as Error).message}`, "TRANSPORT_ERROR", { cause: e });
      }
      // A mapping of the producer's slab: no CRC was taken on the way (the KV handoff checks it).
      if (target !== undefined) {
        const startMs = performance.now();
        const bytes = this.resolve(key, target, options.into);
        return { bytes, crc32: null, transfer: { startMs, endMs: performance.now() } };
      }
      const left = deadline - Date.now();
      if (left <= 0) {
        throw new TransportTimeoutError(
          `pull ${key}: no blob under ${this.root} after ${timeoutMs} ms; check that the producer pushes to the same PD_SHM_ROOT on this host, or raise timeoutMs`,
        );
      }
      await sleep(Math.min(wait, left));
      wait = Math.min(wait * 2, POLL_MAX_MS);
      this.assertOpen("pull");
    }
  }

  async release(requestId: string): Promise<void> {
    validateRequestId(requestId);
    const dir = join(this.keysRoot, requestId);
    for (let attempt = 0; ; attempt++) {
      try {
        rmSync(dir, { recursive: true, force: true });
        break;
      } catch (e) {
        // A producer adding a link while we remove the folder: try again.
        if (errnoCode(e) !== "ENOTEMPTY" || attempt >= 5)
          throw new TransportError(`release ${requestId}: cannot remove ${dir}: ${(e as Error).message}`, "TRANSPORT_ERROR", { cause: e });
      }
    }
    const rec = this.requests.get(requestId);
    if (rec) {
      for (const b of rec.blobs.values()) this.dropBlob(b);
      this.requests.delete(requestId);
    }
  }

  stats(): TransportStats {
    if (!this.closed) this.reclaim(Date.now());
    return { blobs: this.liveBlobs, bytes: this.liveBytes, expired: this.expiredBlobs };
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    clearInterval(this.timer);
    // Links first, so no key ever names a slab that is gone.
    for (const rec of this.requests.values()) {
      for (const b of rec.blobs.values()) this.unlinkOwn(b);
      this.removeDirIfEmpty(rec.dir);
    }
    this.requests.clear();
    this.liveBlobs = 0;
    this.liveBytes = 0;
    for (const s of this.slabs) {
      try {
        unlinkSync(join(this.root, s.name));
      } catch {
        // already swept
      }
      unmap(s.map);
      closeSync(s.fd);
    }
    this.slabs.length = 0;
    for (const r of this.readMaps.values()) unmap(r.map);
    this.readMaps.clear();
    // The last endpoint out leaves nothing under the root: the keys/ folder goes once it is empty
    // (an endpoint still open makes it again when it publishes; a reader treats it as no blob
    // yet). The root itself is the operator's (PD_SHM_ROOT, often a mount point) and stays.
    this.removeDirIfEmpty(this.keysRoot);
  }

  // -------------------------------------------------------------------------------------------
  // producer side

  private publish(rid: string, key: string, blob: Blob): void {
    const target = encodeTarget({ slab: blob.slab.name, offset: blob.offset, length: blob.length });
    const dir = dirname(blob.link);
    let rec = this.requests.get(rid);
    let madeDir = false;
    for (let attempt = 0; ; attempt++) {
      try {
        symlinkSync(target, blob.link);
        break;
      } catch (e) {
        const code = errnoCode(e);
        if (code === "ENOENT" && attempt < 8) {
          mkdirSync(dir, { recursive: true });
          madeDir = true;
          continue;
        }
        if (code === "EEXIST") {
          // Replacing a blob: build the new link aside, then rename over the old one (atomic).
          const tmp = join(dir, `.${basename(blob.link)}.${this.owner}`);
          try {
            unlinkSync(tmp);
          } catch {
            // no stale temporary
          }
          symlinkSync(target, tmp);
          renameSync(tmp, blob.link);
          break;
        }
        if (code === "ENOSPC") throw noSpace(this.root, blob.length, "no room for the key link");
        throw new TransportError(`push ${key}: cannot publish ${blob.link}: ${(e as Error).message}`, "TRANSPORT_ERROR", { cause: e });
      }
    }
    if (!rec) {
      rec = { dir, dirIno: -1, blobs: new Map(), lastPush: 0 };
      this.requests.set(rid, rec);
    }
    // The folder's identity is read once per folder this endpoint made or first wrote into; a
    // request id has one producer, so nobody else recreates it behind our back.
    if (madeDir || rec.dirIno < 0) {
      try {
        rec.dirIno = lstatSync(dir).ino;
      } catch {
        rec.dirIno = -1; // released between the link and now: the blob is already gone
      }
    }
    blob.dirIno = rec.dirIno;
    const old = rec.blobs.get(key);
    if (old) this.dropBlob(old);
    rec.blobs.set(key, blob);
    rec.lastPush = Date.now();
    this.liveBlobs++;
    this.liveBytes += blob.length;
    if (rec.dirIno < 0) this.reclaim(Date.now());
  }

  /** A free region of `length` bytes, reclaiming released regions and growing as needed; null when none can be had now. */
  private allocate(length: number): { slab: Slab; offset: number } | null {
    const fromExisting = (): { slab: Slab; offset: number } | null => {
      for (const slab of this.slabs) {
        if (slab.trimmed) continue;
        const offset = slab.regions.allocate(length);
        if (offset >= 0) return { slab, offset };
      }
      return null;
    };
    let place = fromExisting();
    if (place) return place;
    this.reclaim(Date.now());
    place = fromExisting();
    if (place) return place;
    const need = RangeAllocator.footprint(length, REGION_ALIGN);
    // A trimmed slab that is large enough: reserve its pages again.
    for (const slab of this.slabs) {
      if (slab.trimmed && slab.regions.largestFree() >= need && reserve(slab.fd, slab.map.size) === 0) {
        slab.trimmed = false;
        const offset = slab.regions.allocate(length);
        if (offset >= 0) return { slab, offset };
      }
    }
    const sizes = [Math.max(this.settings.slabBytes, alignUp(need, 1 << 20)), alignUp(need, TIGHT_SLAB_ROUND)];
    for (let pass = 0; pass < 2; pass++) {
      for (const size of sizes) {
        const slab = this.createSlab(size);
        if (slab) {
          const offset = slab.regions.allocate(length);
          return { slab, offset };
        }
      }
      // Out of space: give back the pages of every empty slab and try once more.
      if (pass === 0 && !this.trimEmptySlabs(0)) break;
    }
    return null;
  }

  /** A new reserved, locked and mapped slab of `size` bytes; null on ENOSPC (nothing left behind). */
  private createSlab(size: number): Slab | null {
    const name = `${SLAB_PREFIX}${this.owner}-${this.slabSeq++}`;
    const tmp = join(this.root, `${NEW_SLAB_PREFIX}${name.slice(SLAB_PREFIX.length)}`);
    let fd: number;
    try {
      fd = openSync(tmp, constants.O_RDWR | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW, 0o644);
    } catch (e) {
      if (errnoCode(e) === "ENOSPC") return null;
      throw new TransportError(`cannot create a slab in ${this.root}: ${(e as Error).message}`, "TRANSPORT_ERROR", { cause: e });
    }
    let map: Mapping | undefined;
    try {
      // tryLockExclusive cannot fail here: the file is new and only this descriptor has it open.
      tryLockExclusive(fd);
      const err = reserve(fd, size);
      if (err === ENOSPC) {
        this.discard(tmp, fd);
        return null;
      }
      if (err !== 0) throw new LibcError("posix_fallocate", err);
      map = mapShared(fd, size);
      renameSync(tmp, join(this.root, name));
    } catch (e) {
      if (map) unmap(map);
      this.discard(tmp, fd);
      throw new TransportError(`cannot set up a slab of ${size} bytes in ${this.root}: ${(e as Error).message}`, "TRANSPORT_ERROR", { cause: e });
    }
    const slab: Slab = { name, fd, map, bytes: new Uint8Array(map.bytes), regions: new RangeAllocator(size, REGION_ALIGN), trimmed: false, emptySince: Date.now() };
    this.slabs.push(slab);
    return slab;
  }

  private discard(path: string, fd: number): void {
    try {
      unlinkSync(path);
    } catch {
      // already gone
    }
    closeSync(fd);
  }

  /** Gives back the pages of empty slabs idle for `idleMs` (keeping the first slab when idleMs > 0). True if any. */
  private trimEmptySlabs(idleMs: number): boolean {
    const now = Date.now();
    let any = false;
    this.slabs.forEach((slab, i) => {
      if (slab.trimmed || slab.regions.allocations > 0) return;
      if (idleMs > 0 && (i === 0 || now - slab.emptySince < idleMs)) return;
      punchHole(slab.fd, slab.map.size);
      slab.trimmed = true;
      any = true;
    });
    return any;
  }

  /** Frees regions whose key folder is gone or replaced, and expires requests past the TTL. */
  private reclaim(now: number): void {
    for (const [rid, rec] of this.requests) {
      if (now - rec.lastPush > this.settings.ttlMs) {
        for (const b of rec.blobs.values()) {
          this.unlinkOwn(b);
          this.dropBlob(b);
          this.expiredBlobs++;
        }
        this.removeDirIfEmpty(rec.dir);
        this.requests.delete(rid);
        continue;
      }
      let ino = -1;
      try {
        ino = lstatSync(rec.dir).ino;
      } catch {
        // released
      }
      rec.dirIno = ino;
      for (const [key, b] of rec.blobs) {
        if (ino < 0 || b.dirIno !== ino) {
          this.dropBlob(b);
          rec.blobs.delete(key);
        }
      }
      if (rec.blobs.size === 0) this.requests.delete(rid);
    }
  }

  private maintain(): void {
    if (this.closed) return;
    try {
      const now = Date.now();
      this.reclaim(now);
      this.trimEmptySlabs(IDLE_SLAB_TRIM_MS);
      // A peer that was killed (its flock gone) leaves slabs nobody would remove until the next
      // endpoint opens: the live ones take them away instead, so a crash leaks nothing for long.
      if (now - this.sweptAt >= SWEEP_EVERY_MS) {
        this.sweptAt = now;
        sweepLeftovers(this.root, now);
      }
    } catch {
      // the next round tries again; push and pull report their own errors
    }
  }

  private dropBlob(b: Blob): void {
    this.freeRegion(b.slab, b.offset);
    this.liveBlobs--;
    this.liveBytes -= b.length;
  }

  private freeRegion(slab: Slab, offset: number): void {
    slab.regions.release(offset);
    if (slab.regions.allocations === 0) slab.emptySince = Date.now();
  }

  /** Removes a link if it still names this blob (a later push may have replaced it). */
  private unlinkOwn(b: Blob): void {
    try {
      const loc = parseTarget(readlinkSync(b.link));
      if (loc && loc.slab === b.slab.name && loc.offset === b.offset) unlinkSync(b.link);
    } catch {
      // already gone
    }
  }

  private removeDirIfEmpty(dir: string): void {
    try {
      rmdirSync(dir);
    } catch {
      // other blobs remain, or gone
    }
  }

  // -------------------------------------------------------------------------------------------
  // consumer side

  private resolve(key: string, target: string, into: Uint8Array | undefined): Uint8Array {
    const loc = parseTarget(target);
    if (!loc) throw new TransportError(`pull ${key}: the link under ${this.root} is not an shm blob (${JSON.stringify(target)}); another program writes into PD_SHM_ROOT`);
    const map = this.mappingOf(key, loc.slab);
    if (loc.offset + loc.length > map.size) {
      throw new TransportError(`pull ${key}: blob [${loc.offset}, +${loc.length}) lies outside slab ${loc.slab} of ${map.size} bytes; the root is corrupt, remove ${this.root}`);
    }
    const view = new Uint8Array(map.bytes, loc.offset, loc.length);
    if (!into) return view;
    if (!(into instanceof Uint8Array) || into.byteLength < loc.length) {
      throw new TransportError(`pull ${key}: options.into holds ${into?.byteLength ?? 0} bytes but the blob has ${loc.length}; pass a larger destination`);
    }
    const out = new Uint8Array(into.buffer, into.byteOffset, loc.length);
    out.set(view);
    return out;
  }

  private mappingOf(key: string, slabName: string): Mapping {
    const own = this.slabs.find((s) => s.name === slabName);
    if (own) return own.map;
    const cached = this.readMaps.get(slabName);
    if (cached) return cached.map;
    const path = join(this.root, slabName);
    let fd: number;
    let readOnly = false;
    try {
      try {
        fd = openSync(path, constants.O_RDWR | constants.O_NOFOLLOW);
      } catch (e) {
        if (errnoCode(e) !== "EACCES") throw e;
        fd = openSync(path, constants.O_RDONLY | constants.O_NOFOLLOW);
        readOnly = true;
      }
    } catch (e) {
      if (errnoCode(e) === "ENOENT") {
        throw new TransportError(`pull ${key}: its producer is gone (slab ${slabName} no longer exists); prefill the request again`);
      }
      throw new TransportError(`pull ${key}: cannot open slab ${path}: ${(e as Error).message}`, "TRANSPORT_ERROR", { cause: e });
    }
    try {
      const size = fstatSync(fd).size;
      const map = mapShared(fd, size, readOnly);
      this.readMaps.set(slabName, { map });
      return map;
    } catch (e) {
      throw new TransportError(`pull ${key}: cannot map slab ${path}: ${(e as Error).message}`, "TRANSPORT_ERROR", { cause: e });
    } finally {
      closeSync(fd);
    }
  }

  private assertOpen(op: string): void {
    if (this.closed) throw new TransportError(`${op} on a closed shm transport; create a new one`, "TRANSPORT_CLOSED");
  }
}
