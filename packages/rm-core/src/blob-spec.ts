// The dtype/layout check every transport runs on push and pull against what it declared.

import { KV_LAYOUT, type PullOptions, type PushOptions, type TransportSupport } from "./contracts.ts";
import { UnsupportedError } from "./errors.ts";

/** Throws UnsupportedError when options name a dtype or layout the transport does not declare. */
export function checkBlobSpec(t: { name: string; support: TransportSupport }, options: PushOptions | PullOptions = {}): void {
  const dtype = options.dtype ?? "bf16";
  const layout = options.layout ?? KV_LAYOUT;
  if (!t.support.dtypes.includes(dtype)) {
    throw new UnsupportedError(`${t.name} does not carry dtype ${JSON.stringify(dtype)}; it supports ${t.support.dtypes.join(", ")}`);
  }
  if (!t.support.layouts.includes(layout)) {
    throw new UnsupportedError(`${t.name} does not carry layout ${JSON.stringify(layout)}; it supports ${t.support.layouts.join(", ")}`);
  }
}
