// First-fit allocator of byte ranges inside one fixed-size slab, with neighbouring free ranges
// merged on free. Pure bookkeeping: it never touches memory or files.

/** Every region starts on this boundary (bytes); lengths are rounded up to it. */
export const REGION_ALIGN = 64;

export function alignUp(n: number, to: number): number {
  return Math.ceil(n / to) * to;
}

export class RegionAllocator {
  readonly size: number;
  /** Free ranges [offset, offset + length), sorted by offset, never adjacent. */
  private free: { offset: number; length: number }[];
  private usedBytes = 0;

  constructor(size: number) {
    this.size = size;
    this.free = size > 0 ? [{ offset: 0, length: size }] : [];
  }

  /** Bytes a region of `length` takes (at least one alignment unit). */
  static footprint(length: number): number {
    return Math.max(REGION_ALIGN, alignUp(length, REGION_ALIGN));
  }

  /** The offset of a new region of `length` bytes, or -1 when no free range is large enough. */
  alloc(length: number): number {
    const need = RegionAllocator.footprint(length);
    for (let i = 0; i < this.free.length; i++) {
      const f = this.free[i];
      if (f.length < need) continue;
      const offset = f.offset;
      if (f.length === need) this.free.splice(i, 1);
      else {
        f.offset += need;
        f.length -= need;
      }
      this.usedBytes += need;
      return offset;
    }
    return -1;
  }

  /** Returns a region given out by `alloc(length)`. Throws RangeError on a range that is not allocated. */
  release(offset: number, length: number): void {
    const need = RegionAllocator.footprint(length);
    const end = offset + need;
    if (offset < 0 || end > this.size) throw new RangeError(`region [${offset}, ${end}) is outside the slab of ${this.size} bytes`);
    let i = 0;
    while (i < this.free.length && this.free[i].offset < offset) i++;
    const prev = this.free[i - 1];
    const next = this.free[i];
    if ((prev && prev.offset + prev.length > offset) || (next && next.offset < end)) {
      throw new RangeError(`region [${offset}, ${end}) overlaps free space: freed twice?`);
    }
    const joinPrev = prev !== undefined && prev.offset + prev.length === offset;
    const joinNext = next !== undefined && next.offset === end;
    if (joinPrev && joinNext) {
      prev.length += need + next.length;
      this.free.splice(i, 1);
    } else if (joinPrev) prev.length += need;
    else if (joinNext) {
      next.offset = offset;
      next.length += need;
    } else this.free.splice(i, 0, { offset, length: need });
    this.usedBytes -= need;
  }

  get used(): number {
    return this.usedBytes;
  }

  get empty(): boolean {
    return this.usedBytes === 0;
  }

  /** The largest region `alloc` could give right now (bytes). */
  get largestFree(): number {
    let m = 0;
    for (const f of this.free) m = Math.max(m, f.length);
    return m;
  }
}
