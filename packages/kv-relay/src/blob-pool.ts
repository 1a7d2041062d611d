// The relay's blob memory: a byte-capped pool of pre-touched buffers reused across requests, so a
// push lands in memory whose pages are already faulted in. Knows sizes and the cap; the relay
// decides what a slot holds and when it is freed.

/** One buffer handed out by the pool; `buf.length` is the size class, >= the blob. */
export interface PoolSlot {
  readonly buf: Buffer;
  readonly classBytes: number;
}

const KIB = 1024;

/** The size class of a blob: 4 KiB minimum, powers of two up to 64 KiB, then multiples of 64 KiB. */
export function sizeClass(bytes: number): number {
  if (bytes <= 4 * KIB) return 4 * KIB;
  if (bytes <= 64 * KIB) return 2 ** Math.ceil(Math.log2(bytes));
  return Math.ceil(bytes / (64 * KIB)) * 64 * KIB;
}

export class BlobPool {
  /** Bytes of slots handed out and not yet freed (what the cap limits). */
  heldBytes = 0;
  /** Bytes of freed slots kept for reuse (counted against the cap together with heldBytes). */
  idleBytes = 0;
  /** Slots served from the idle lists (pages already touched). */
  reused = 0;
  /** Slots freshly allocated and touched. */
  allocated = 0;
  private readonly idle = new Map<number, Buffer[]>();

  /**
   * @param maxBytes the cap on heldBytes + idleBytes
   * @param reuse keep freed slots for later pushes (false: allocate every slot afresh, for measurements)
   */
  constructor(
    readonly maxBytes: number,
    private readonly reuse = true,
  ) {}

  /** True if a blob of `bytes` could be reserved right now. */
  fits(bytes: number): boolean {
    return this.heldBytes + sizeClass(bytes) <= this.maxBytes;
  }

  /** A slot for a blob of `bytes`, or undefined when the cap leaves no room. */
  tryReserve(bytes: number): PoolSlot | undefined {
    const classBytes = sizeClass(bytes);
    if (this.heldBytes + classBytes > this.maxBytes) return undefined;
    const list = this.idle.get(classBytes);
    let buf = list?.pop();
    if (buf) {
      this.idleBytes -= classBytes;
      this.reused++;
    } else {
      this.trimIdle(this.maxBytes - this.heldBytes - classBytes);
      buf = Buffer.allocUnsafeSlow(classBytes);
      buf.fill(0); // touch every page now, not while a socket is waiting on it
      this.allocated++;
    }
    this.heldBytes += classBytes;
    return { buf, classBytes };
  }

  /** Returns a slot; its buffer must no longer be read or written by anyone. */
  free(slot: PoolSlot): void {
    this.heldBytes -= slot.classBytes;
    if (!this.reuse) return;
    if (this.heldBytes + this.idleBytes + slot.classBytes > this.maxBytes) return;
    let list = this.idle.get(slot.classBytes);
    if (!list) this.idle.set(slot.classBytes, (list = []));
    list.push(slot.buf);
    this.idleBytes += slot.classBytes;
  }

  /** Drops idle buffers (largest classes first) until idleBytes <= `budget`. */
  private trimIdle(budget: number): void {
    if (this.idleBytes <= budget) return;
    const classes = [...this.idle.keys()].sort((a, b) => b - a);
    for (const c of classes) {
      const list = this.idle.get(c)!;
      while (list.length && this.idleBytes > budget) {
        list.pop();
        this.idleBytes -= c;
      }
      if (!list.length) this.idle.delete(c);
      if (this.idleBytes <= budget) return;
    }
  }
}
