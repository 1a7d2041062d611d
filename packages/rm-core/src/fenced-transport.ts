// Adapts a copy-only transport (plan/submit/wait) to push/pull. push = plan + submit; pull
// returns only once the completion fence (wait) reports every copy done. The handle lives in
// this process, so a pull from another process times out with a message that says so, unless
// the transport can adopt handles submitted elsewhere (a per-host agent: nixl).

import type { CopyHandle, CopyOnlyTransport, KVTransport, PulledBlob, PullOptions, PushOptions, TransportSupport } from "./contracts.ts";
import { TransportError, TransportTimeoutError } from "./errors.ts";
import { requestIdOf, validateKey, validateRequestId } from "./kv-key.ts";
import { checkBlobSpec } from "./blob-spec.ts";

export const DEFAULT_PULL_TIMEOUT_MS = 30_000;

export class FencedTransport implements KVTransport {
  readonly name: string;
  readonly support: TransportSupport;
  private readonly handles = new Map<string, CopyHandle>();
  private readonly waiters = new Map<string, Array<() => void>>();
  private closed = false;

  constructor(private readonly inner: CopyOnlyTransport) {
    this.name = inner.name;
    this.support = { ...inner.support, copyOnly: false };
  }

  async push(key: string, data: Uint8Array, options: PushOptions = {}): Promise<void> {
    this.ensureOpen();
    validateKey(key);
    checkBlobSpec(this.inner, options);
    const crc32 = options.crc32;
    if (crc32 !== undefined && !(Number.isInteger(crc32) && crc32 >= 0 && crc32 <= 0xffffffff)) {
      throw new TransportError(`${this.name}: crc32 must be a uint32, got ${crc32}`);
    }
    const plan = await this.inner.plan({ requestId: requestIdOf(key), key, src: data, ...(crc32 === undefined ? {} : { crc32 }) });
    const handle = await this.inner.submit(plan);
    this.handles.set(key, handle);
    for (const w of this.waiters.get(key) ?? []) w();
    this.waiters.delete(key);
  }

  async pull(key: string, options: PullOptions = {}): Promise<PulledBlob> {
    this.ensureOpen();
    validateKey(key);
    checkBlobSpec(this.inner, options);
    const timeoutMs = options.timeoutMs ?? DEFAULT_PULL_TIMEOUT_MS;
    const deadline = Date.now() + timeoutMs;
    let handle = this.handles.get(key);
    if (!handle && this.inner.adopt) handle = await this.inner.adopt(key, timeoutMs);
    if (!handle) {
      await new Promise<void>((resolve, reject) => {
        const timer = setTimeout(() => {
          const list = this.waiters.get(key) ?? [];
          this.waiters.set(
            key,
            list.filter((w) => w !== done),
          );
          reject(
            new TransportTimeoutError(
              `${this.name}: no copy of ${key} was submitted in this process within ${timeoutMs} ms; ` +
                `a copy-only transport keeps its handles in one process, so prefill and decode must share it`,
            ),
          );
        }, timeoutMs);
        const done = () => {
          clearTimeout(timer);
          resolve();
        };
        const list = this.waiters.get(key) ?? [];
        list.push(done);
        this.waiters.set(key, list);
      });
      handle = this.handles.get(key)!;
    }
    const status = await this.inner.wait(handle, Math.max(0, deadline - Date.now()));
    if (!status.ok) throw new TransportError(`${this.name}: copy of ${key} failed: ${status.reason}`);
    if (options.into) {
      if (options.into.byteLength < status.data.byteLength) {
        throw new TransportError(`${this.name}: destination of ${status.data.byteLength} bytes needed for ${key}, got ${options.into.byteLength}`);
      }
      options.into.set(status.data);
      return { bytes: options.into.subarray(0, status.data.byteLength), crc32: status.crc32 ?? null };
    }
    return { bytes: status.data, crc32: status.crc32 ?? null };
  }

  async release(requestId: string): Promise<void> {
    validateRequestId(requestId);
    for (const key of [...this.handles.keys()]) if (requestIdOf(key) === requestId) this.handles.delete(key);
    await this.inner.release(requestId);
  }

  async close(): Promise<void> {
    this.closed = true;
    this.handles.clear();
    await this.inner.close();
  }

  stats() {
    if (this.inner.stats) return this.inner.stats();
    return { blobs: this.handles.size, bytes: [...this.handles.values()].reduce((s, h) => s + h.plan.bytes, 0), expired: 0 };
  }

  private ensureOpen(): void {
    if (this.closed) throw new TransportError(`${this.name}: transport is closed`, "TRANSPORT_CLOSED");
  }
}
