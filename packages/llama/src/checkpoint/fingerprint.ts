// The model fingerprint: sha-256 over the canonical config JSON and every tensor's name, dtype,
// shape and stored-bytes hash. Two checkpoints with equal fingerprints compute the same thing.

import { createHash } from "node:crypto";
import type { ModelConfig, TensorSource } from "../checkpoint-types.ts";

/** JSON with object keys sorted at every level (stable across key order in the source). */
export function canonicalJson(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(",")}]`;
  if (value && typeof value === "object") {
    const entries = Object.entries(value as Record<string, unknown>)
      .filter(([, v]) => v !== undefined)
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
    return `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${canonicalJson(v)}`).join(",")}}`;
  }
  return JSON.stringify(value);
}

/** sha-256 hex of the config and all tensors (sorted by name). Reads every tensor's bytes once. */
export function modelFingerprint(config: ModelConfig, tensors: TensorSource): string {
  const hash = createHash("sha256");
  hash.update(canonicalJson(config));
  const list = tensors.list().sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  for (const t of list) hash.update(`\n${t.name}\t${t.dtype}\t${t.shape.join("x")}\t${tensors.sha256(t.name)}`);
  return hash.digest("hex");
}
