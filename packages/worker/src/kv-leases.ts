// KV leases: one per request on each worker that touches its blobs. A lease ends on a terminal
// event (done, client gone, decode rejected, prefill failed, aborted) or expires after its TTL;
// either way the request's blobs are released in the transport exactly once here, and the
// outcome is counted. The TTL bounds how long pushed blobs wait for a decode that never comes, so
// it runs only while blobs wait (armed when a prefill has pushed them): a long prompt's prefill
// and a long generation's decode are not cut by it. Knows nothing about HTTP or engines.

export type LeaseEnd = "done" | "client_gone" | "decode_rejected" | "prefill_failed" | "aborted" | "deadline" | "expired";

export const LEASE_END_REASONS: readonly LeaseEnd[] = ["done", "client_gone", "decode_rejected", "prefill_failed", "aborted", "deadline", "expired"];

interface Lease {
  requestId: string;
  openedAt: number;
  /** The TTL's timer while it runs. */
  timer: NodeJS.Timeout | null;
  /** Called when the lease ends for any reason, before the blobs are released (e.g. to stop a decode). */
  onEnd?: (reason: LeaseEnd) => void;
}

export interface LeaseCounters {
  outstanding: number;
  expired: number;
  ended: Record<LeaseEnd, number>;
}

export class LeaseTable {
  private readonly leases = new Map<string, Lease>();
  private readonly ended = Object.fromEntries(LEASE_END_REASONS.map((r) => [r, 0])) as Record<LeaseEnd, number>;

  /**
   * @param ttlMs lease lifetime (ms)
   * @param releaseBlobs frees a request's blobs in the transport (idempotent, may reject)
   * @param onEnd observer for metrics
   */
  constructor(
    private readonly ttlMs: number,
    private readonly releaseBlobs: (requestId: string) => Promise<void>,
    private readonly onEnd: (reason: LeaseEnd, requestId: string) => void = () => {},
  ) {}

  has(requestId: string): boolean {
    return this.leases.has(requestId);
  }

  /**
   * Opens a lease, its TTL running from now unless `armed` is false (then arm() starts it);
   * returns false when one is already open for this request.
   */
  open(requestId: string, onEnd?: (reason: LeaseEnd) => void, armed = true): boolean {
    if (this.leases.has(requestId)) return false;
    this.leases.set(requestId, { requestId, openedAt: Date.now(), timer: null, onEnd });
    if (armed) this.arm(requestId);
    return true;
  }

  /** Starts (or restarts) a lease's TTL from now; no-op without an open lease. */
  arm(requestId: string): void {
    const lease = this.leases.get(requestId);
    if (!lease) return;
    if (lease.timer) clearTimeout(lease.timer);
    lease.timer = setTimeout(() => void this.end(requestId, "expired"), this.ttlMs);
    lease.timer.unref();
  }

  /**
   * Ends a lease and releases the request's blobs. Without an open lease the blobs are still
   * released (a late release from the gateway) but nothing is counted. Resolves to whether a lease
   * was open. Never throws: a failed release is reported through `onReleaseError`.
   */
  async end(requestId: string, reason: LeaseEnd, onReleaseError?: (err: unknown) => void): Promise<boolean> {
    const lease = this.leases.get(requestId);
    if (lease) {
      this.leases.delete(requestId);
      if (lease.timer) clearTimeout(lease.timer);
      this.ended[reason]++;
      lease.onEnd?.(reason);
      this.onEnd(reason, requestId);
    }
    try {
      await this.releaseBlobs(requestId);
    } catch (err) {
      onReleaseError?.(err);
    }
    return lease !== undefined;
  }

  counters(): LeaseCounters {
    return { outstanding: this.leases.size, expired: this.ended.expired, ended: { ...this.ended } };
  }

  /** Ends every open lease (shutdown). */
  async endAll(reason: LeaseEnd): Promise<void> {
    await Promise.all([...this.leases.keys()].map((id) => this.end(id, reason)));
  }
}
