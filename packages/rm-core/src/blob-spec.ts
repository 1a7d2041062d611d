// The dtype/layout check every transport runs on push and pull against what it declared, and the
// support declaration the host-staging transports share.

import type { PullOptions, PushOptions, TransportScope, TransportSupport } from "./contracts.ts";
import { KV_LAYOUT } from "./kv-layout.ts";
import { TransportError, UnsupportedError } from "./errors.ts";

/**
 * Throws UnsupportedError when options name a dtype or layout the transport does not declare, and
 * TransportError when a push's crc32 is not an unsigned 32-bit integer.
 */
export function checkBlobSpec(t: { name: string; support: TransportSupport }, options: PushOptions | PullOptions = {}): void {
  const dtype = options.dtype ?? "bf16";
  const layout = options.layout ?? KV_LAYOUT;
  if (!t.support.dtypes.includes(dtype)) {
    throw new UnsupportedError(`${t.name} does not carry dtype ${JSON.stringify(dtype)}; it supports ${t.support.dtypes.join(", ")}`);
  }
  if (!t.support.layouts.includes(layout)) {
    throw new UnsupportedError(`${t.name} does not carry layout ${JSON.stringify(layout)}; it supports ${t.support.layouts.join(", ")}`);
  }
  const crc = (options as PushOptions).crc32;
  if (crc !== undefined && (typeof crc !== "number" || !Number.isInteger(crc) || crc < 0 || crc > 0xffff_ffff)) {
    throw new TransportError(`${t.name}: push option crc32 must be an unsigned 32-bit integer (the blob's CRC-32), got ${JSON.stringify(crc)}`);
  }
}

/** What a host-staging transport supports: host DRAM to host DRAM, bf16/fp16, layout rngd-pd/v1, push/pull. */
export function hostStagingSupport(scope: TransportScope[]): TransportSupport {
  return { scope, tiers: ["host-dram"], dtypes: ["bf16", "fp16"], layouts: [KV_LAYOUT], copyOnly: false };
}
