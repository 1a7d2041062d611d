// Offsets inside one fixed-size region of memory (a shm slab, a registered UCX arena): first-fit
// allocation with neighbour coalescing on free. It hands out byte ranges only; what lives in them
// and who may touch them is the caller's business.

/** Range allocator over [0, size). Sizes are rounded up to `align` bytes (at least one unit). */
export class RangeAllocator {
  readonly size: number;
  readonly align: number;
  /** Free ranges sorted by offset, never adjacent (coalesced). */
  private free: { offset: number; length: number }[];
  private used = new Map<number, number>();
  private usedBytes = 0;

  constructor(size: number, align = 256) {
    if (!Number.isSafeInteger(size) || size <= 0) throw new RangeError(`arena size must be a positive integer, got ${size}`);
    this.size = size;
    this.align = align;
    this.free = [{ offset: 0, length: size }];
  }

  /** Bytes a range of `length` takes in an allocator with `align`-byte units. */
  static footprint(length: number, align: number): number {
    return Math.max(align, Math.ceil(length / align) * align);
  }

  /** Bytes a range of `length` takes here. */
  footprint(length: number): number {
    return RangeAllocator.footprint(length, this.align);
  }

  /** Offset of a fresh range of at least `length` bytes, or -1 when no free range is big enough. */
  allocate(length: number): number {
    const need = this.footprint(length);
    for (let i = 0; i < this.free.length; i++) {
      const r = this.free[i];
      if (r.length < need) continue;
      const offset = r.offset;
      if (r.length === need) this.free.splice(i, 1);
      else {
        r.offset += need;
        r.length -= need;
      }
      this.used.set(offset, need);
      this.usedBytes += need;
      return offset;
    }
    return -1;
  }

  /** Returns a range to the pool. Throws RangeError for an offset that is not allocated. */
  release(offset: number): void {
    const length = this.used.get(offset);
    if (length === undefined) throw new RangeError(`offset ${offset} is not an allocated range`);
    this.used.delete(offset);
    this.usedBytes -= length;
    let i = 0;
    while (i < this.free.length && this.free[i].offset < offset) i++;
    this.free.splice(i, 0, { offset, length });
    const next = this.free[i + 1];
    if (next && offset + length === next.offset) {
      this.free[i].length += next.length;
      this.free.splice(i + 1, 1);
    }
    const prev = this.free[i - 1];
    if (prev && prev.offset + prev.length === offset) {
      prev.length += this.free[i].length;
      this.free.splice(i, 1);
    }
  }

  /** Bytes currently allocated (after rounding). */
  get allocatedBytes(): number {
    return this.usedBytes;
  }

  get allocations(): number {
    return this.used.size;
  }

  /** Size of the largest range allocate() could return now. */
  largestFree(): number {
    return this.free.reduce((m, r) => Math.max(m, r.length), 0);
  }
}
