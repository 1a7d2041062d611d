// Plans a partial weight update: compares two checkpoints tensor by tensor (name, dtype, shape,
// sha-256 of the stored bytes) and lists what must be uploaded. A different config, or a tensor
// added, removed or reshaped, cannot be patched in place and asks for a full reload instead.

/** The part of a TensorInfo a plan needs. */
export interface TensorShapeInfo {
  name: string;
  dtype: string;
  shape: number[];
}

/** The part of a TensorSource a plan needs. */
export interface HashedTensors {
  list(): TensorShapeInfo[];
  sha256(name: string): string;
}

export interface TensorDeltaPlan {
  /** Tensors whose bytes changed (same name, dtype and shape): upload these. */
  changed: string[];
  unchanged: number;
  added: string[];
  removed: string[];
  /** Same name, other dtype or shape. */
  reshaped: string[];
  /** bf16 bytes to upload for `changed`. */
  uploadBytes: number;
  /** bf16 bytes of the whole model. */
  totalBytes: number;
  /** True when the update cannot be applied tensor by tensor. */
  fullReloadRequired: boolean;
  /** Why a full reload is required, in one line. */
  reason: string | null;
}

function elements(t: TensorShapeInfo): number {
  return t.shape.reduce((a, b) => a * b, 1);
}

function configDiff(a: object, b: object): string[] {
  const ra = a as Record<string, unknown>;
  const rb = b as Record<string, unknown>;
  const keys = new Set([...Object.keys(ra), ...Object.keys(rb)]);
  return [...keys].filter((k) => JSON.stringify(ra[k]) !== JSON.stringify(rb[k])).sort();
}

/**
 * The upload plan from `current` to `next`. Reads only per-tensor hashes (a safetensors source
 * hashes each tensor's stored bytes once). Never throws for a difference; it reports it.
 */
export function planTensorDelta(current: { config: object; tensors: HashedTensors }, next: { config: object; tensors: HashedTensors }): TensorDeltaPlan {
  const before = new Map(current.tensors.list().map((t) => [t.name, t]));
  const after = new Map(next.tensors.list().map((t) => [t.name, t]));
  const changed: string[] = [];
  const added: string[] = [];
  const removed: string[] = [];
  const reshaped: string[] = [];
  let unchanged = 0;
  let uploadBytes = 0;
  let totalBytes = 0;
  for (const [name, t] of after) {
    totalBytes += elements(t) * 2;
    const old = before.get(name);
    if (!old) {
      added.push(name);
      continue;
    }
    if (old.dtype !== t.dtype || old.shape.join("x") !== t.shape.join("x")) {
      reshaped.push(name);
      continue;
    }
    if (current.tensors.sha256(name) === next.tensors.sha256(name)) unchanged++;
    else {
      changed.push(name);
      uploadBytes += elements(t) * 2;
    }
  }
  for (const name of before.keys()) if (!after.has(name)) removed.push(name);
  const cfg = configDiff(current.config, next.config);
  const reasons: string[] = [];
  if (cfg.length) reasons.push(`config differs in ${cfg.join(", ")}`);
  if (added.length) reasons.push(`${added.length} tensor(s) added (${added.slice(0, 3).join(", ")})`);
  if (removed.length) reasons.push(`${removed.length} tensor(s) removed (${removed.slice(0, 3).join(", ")})`);
  if (reshaped.length) reasons.push(`${reshaped.length} tensor(s) changed dtype or shape (${reshaped.slice(0, 3).join(", ")})`);
  const sort = (xs: string[]): string[] => xs.sort();
  return {
    changed: sort(changed),
    unchanged,
    added: sort(added),
    removed: sort(removed),
    reshaped: sort(reshaped),
    uploadBytes,
    totalBytes,
    fullReloadRequired: reasons.length > 0,
    reason: reasons.length ? reasons.join("; ") : null,
  };
}
