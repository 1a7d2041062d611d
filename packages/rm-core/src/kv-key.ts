// Blob keys of the KV handoff: `<request-id>/<layer>/<k|v>` and `<request-id>/manifest`.
// Every transport validates keys here so none can be used to escape its namespace.

import { InvalidKeyError } from "./errors.ts";

export const MAX_KEY_LENGTH = 200;
const SEGMENT = /^[A-Za-z0-9_][A-Za-z0-9._-]*$/;

/** Throws InvalidKeyError unless `key` is 1-200 chars of segments [A-Za-z0-9._-] joined by "/". */
export function validateKey(key: unknown): string {
  if (typeof key !== "string") throw new InvalidKeyError(`KV key must be a string, got ${typeof key}`);
  if (key.length === 0) throw new InvalidKeyError("KV key is empty");
  if (key.length > MAX_KEY_LENGTH) {
    throw new InvalidKeyError(`KV key is ${key.length} characters; the limit is ${MAX_KEY_LENGTH}`);
  }
  const segments = key.split("/");
  for (const s of segments) {
    if (!SEGMENT.test(s) || s === "." || s === "..") {
      throw new InvalidKeyError(
        `KV key ${JSON.stringify(key)} has a bad segment ${JSON.stringify(s)}: use letters, digits, ".", "_", "-", ` +
          `segments separated by a single "/", no leading "." and no "..", NUL or empty segments`,
      );
    }
  }
  return key;
}

/** The request id is the first segment of a key; a request id alone is a one-segment key. */
export function validateRequestId(id: unknown): string {
  validateKey(id);
  if ((id as string).includes("/")) throw new InvalidKeyError(`request id ${JSON.stringify(id)} must not contain "/"`);
  return id as string;
}

export function requestIdOf(key: string): string {
  const i = key.indexOf("/");
  return i < 0 ? key : key.slice(0, i);
}

export function blobKey(requestId: string, layer: number, kind: "k" | "v"): string {
  return `${requestId}/${layer}/${kind}`;
}

export function manifestKey(requestId: string): string {
  return `${requestId}/manifest`;
}
