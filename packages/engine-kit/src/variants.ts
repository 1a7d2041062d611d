// Compiled variants: an NPU graph is compiled for a fixed batch width B and context bucket S.
// Lists them, picks the smallest that fits a request, and refuses with ContextOverflowError past
// the largest S (max_model_len). Knows nothing about what runs a variant.

import { ConfigError, ContextOverflowError } from "@airm/rm-core";
import type { EngineVariant } from "@airm/rm-core";
import { contextBuckets } from "./kv-budget.ts";

/** Batch widths compiled for decode by default: B1 and the seed's B4/B8/B16 (a step runs the smallest that holds its streams). */
export const DEFAULT_DECODE_BATCHES = [1, 4, 8, 16];

/**
 * Parses `AIRM_VARIANTS`-style text: `B4xS512,B1xS256` or `4x512,1x256`. Throws ConfigError
 * naming the bad item.
 */
export function parseVariants(text: string, key = "AIRM_VARIANTS"): EngineVariant[] {
  const out: EngineVariant[] = [];
  for (const raw of text
    .split(",")
    .map((s) => s.trim())
    .filter(Boolean)) {
    const m = /^B?(\d+)\s*[xX]\s*S?(\d+)$/.exec(raw);
    if (!m) throw new ConfigError(key, `"${raw}" is not a variant; write B<batch>xS<seqLen>, e.g. B4xS512`);
    const batch = Number(m[1]);
    const seqLen = Number(m[2]);
    if (batch < 1 || batch > 256) throw new ConfigError(key, `"${raw}": batch must be 1..256`);
    if (seqLen < 8 || seqLen > 131072) throw new ConfigError(key, `"${raw}": seqLen must be 8..131072`);
    out.push({ batch, seqLen });
  }
  if (out.length === 0) throw new ConfigError(key, "no variant given");
  return normalizeVariants(out);
}

/** Sorted by (seqLen, batch), duplicates removed. */
export function normalizeVariants(list: EngineVariant[]): EngineVariant[] {
  const seen = new Set<string>();
  return [...list]
    .sort((a, b) => a.seqLen - b.seqLen || a.batch - b.batch)
    .filter((v) => {
      const k = variantName(v);
      if (seen.has(k)) return false;
      seen.add(k);
      return true;
    });
}

/** `B4xS512`. */
export function variantName(v: EngineVariant): string {
  return `B${v.batch}xS${v.seqLen}`;
}

/**
 * The variants an engine compiles by default: batches 1, 4, 8 and 16 (capped by, and including,
 * an asked `batch`: B8 compiles B1, B4, B8) at every context bucket up to max_model_len (512,
 * 1024, ... and max_model_len itself).
 */
export function defaultVariants(o: { maxModelLen: number; batch?: number }): EngineVariant[] {
  if (!Number.isInteger(o.maxModelLen) || o.maxModelLen < 8) throw new ConfigError("maxModelLen", `must be an integer >= 8, got ${o.maxModelLen}`);
  const batches = new Set([...DEFAULT_DECODE_BATCHES.filter((b) => b <= (o.batch ?? Number.POSITIVE_INFINITY)), o.batch ?? 1]);
  return normalizeVariants(contextBuckets(o.maxModelLen).flatMap((seqLen) => [...batches].map((batch) => ({ batch, seqLen }))));
}

/**
 * The smallest variant with S >= promptTokens + maxTokens and B >= batch. Throws
 * ContextOverflowError (stating the requested total and the largest compiled S) when no S is
 * large enough, ConfigError for a bad count or a batch wider than every variant.
 */
export function pickVariant(variants: EngineVariant[], promptTokens: number, maxTokens: number, batch = 1): EngineVariant {
  if (!Number.isInteger(promptTokens) || promptTokens < 1) throw new ConfigError("promptTokens", `must be an integer >= 1, got ${promptTokens}`);
  if (!Number.isInteger(maxTokens) || maxTokens < 0) throw new ConfigError("maxTokens", `must be an integer >= 0, got ${maxTokens}`);
  const need = promptTokens + maxTokens;
  const largest = Math.max(...variants.map((v) => v.seqLen));
  if (need > largest) {
    throw new ContextOverflowError(need, largest, `prompt ${promptTokens} + max_tokens ${maxTokens}`);
  }
  const fit = variants.filter((v) => v.seqLen >= need && v.batch >= batch).sort((a, b) => a.seqLen - b.seqLen || a.batch - b.batch);
  if (fit.length === 0) {
    throw new ConfigError("batch", `no compiled variant has batch >= ${batch} with S >= ${need}; compiled: ${variants.map(variantName).join(", ")}`);
  }
  return fit[0];
}
