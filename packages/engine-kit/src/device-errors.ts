// Typed errors for device discovery and selection, refining rm-core's DeviceError (code DEVICE)
// so hosts can check them with isAirmError(e, "DEVICE").

import { DeviceError } from "@airm/rm-core";

/** Which step of device selection failed; stable for tests and logs. */
export type DeviceErrorReason = "NO_SUCH_ORDINAL" | "AMBIGUOUS" | "CHECKPOINT_UNREADABLE" | "CHECKPOINT_MALFORMED" | "ALLOCATION_NOT_VISIBLE" | "UNKNOWN_DEVICE_ID" | "BAD_CHIP";

/** Device discovery or selection failed; the message says what to change. */
export class DeviceSelectionError extends DeviceError {
  readonly reason: DeviceErrorReason;
  constructor(reason: DeviceErrorReason, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.reason = reason;
  }
}

/** A vendor runtime library that was found but misbehaved (bad symbol, failing call). */
export class NativeRuntimeError extends DeviceError {
  readonly call: string;
  constructor(call: string, message: string, options?: { cause?: unknown }) {
    super(`${call}: ${message}`, options);
    this.call = call;
  }
}
