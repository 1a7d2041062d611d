// The sampling defaults a checkpoint recommends, read where vLLM's `--generation-config auto`
// and llama.cpp read them: a Hugging Face folder's generation_config.json (vLLM's list:
// repetition_penalty, temperature, top_k, top_p, min_p) and a GGUF's `general.sampling.*` keys
// (llama.cpp's LLM_KV_GENERAL_SAMPLING_*: temp, top_p, top_k, min_p, penalty_repeat). A value
// of the wrong type or out of its request field's range is left out and named, never a load
// failure. Whether they are used, and how a request overrides them, is the serving side's.

import { SAMPLING_DEFAULT_FIELDS, type SamplingDefaults } from "@airm/rm-core";
import type { GenerationDefaults } from "../checkpoint-types.ts";

type Key = keyof SamplingDefaults;

/** generation_config.json's key for each default. */
export const HF_SAMPLING_KEYS: Record<Key, string> = {
  temperature: "temperature",
  topP: "top_p",
  topK: "top_k",
  minP: "min_p",
  repetitionPenalty: "repetition_penalty",
};

/** The GGUF metadata key llama.cpp reads for each default (src/llama-arch.cpp). */
export const GGUF_SAMPLING_KEYS: Record<Key, string> = {
  temperature: "general.sampling.temp",
  topP: "general.sampling.top_p",
  topK: "general.sampling.top_k",
  minP: "general.sampling.min_p",
  repetitionPenalty: "general.sampling.penalty_repeat",
};

/** Each default's range: the request field's (SamplingDefaultsSchema). */
const RANGES: Record<Key, [(x: number) => boolean, string]> = {
  temperature: [(x) => x >= 0 && x <= 2, "a number in [0, 2]"],
  topP: [(x) => x > 0 && x <= 1, "a number in (0, 1]"],
  topK: [(x) => Number.isInteger(x) && x >= -1, "an integer >= -1"],
  minP: [(x) => x >= 0 && x <= 1, "a number in [0, 1]"],
  repetitionPenalty: [(x) => x > 0 && x <= 10, "a number in (0, 10]"],
};

/**
 * The shortest decimal that is the same float32 as `v` (0.949999988 -> 0.95): GGUF stores these
 * as f32, the converter wrote them from generation_config.json's decimals. Other values as they are.
 */
function decimalOfF32(v: number): number {
  if (Math.fround(v) !== v) return v;
  for (let digits = 1; digits <= 9; digits++) {
    const d = Number(v.toPrecision(digits));
    if (Math.fround(d) === v) return d;
  }
  return v;
}

/**
 * The sampling defaults `get` finds under `keys`, checked: a non-number, or a number outside its
 * request field's range, is left out and named in samplingIgnored as `key=value (why)`. `from`
 * says where they were looked for; `f32` reads float32 values as their shortest decimal.
 */
export function samplingDefaultsOf(
  get: (key: string) => unknown,
  keys: Record<Key, string>,
  o: { from: string; f32?: boolean },
): Pick<GenerationDefaults, Key | "samplingFrom" | "samplingIgnored"> {
  const out: Pick<GenerationDefaults, Key | "samplingFrom" | "samplingIgnored"> = { samplingFrom: o.from };
  const ignored: string[] = [];
  for (const k of Object.keys(keys) as Key[]) {
    const raw = get(keys[k]);
    if (raw === undefined || raw === null) continue;
    const n = typeof raw === "bigint" ? Number(raw) : raw;
    const [ok, range] = RANGES[k];
    if (typeof n !== "number" || !Number.isFinite(n) || !ok(n)) {
      ignored.push(`${keys[k]}=${JSON.stringify(typeof raw === "bigint" ? String(raw) : raw)} (${SAMPLING_DEFAULT_FIELDS[k]} must be ${range})`);
      continue;
    }
    out[k] = o.f32 ? decimalOfF32(n) : n;
  }
  if (ignored.length) out.samplingIgnored = ignored;
  return out;
}

/** The sampling part of `g` (no eos, no provenance). */
export function samplingDefaults(g: GenerationDefaults): SamplingDefaults {
  const out: SamplingDefaults = {};
  for (const k of Object.keys(HF_SAMPLING_KEYS) as Key[]) if (g[k] !== undefined) out[k] = g[k];
  return out;
}
