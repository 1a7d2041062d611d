// Reads the three load figures the picker needs out of a model server's Prometheus text
// exposition (vLLM's names, as GIE v1.5.0's metrics extractor reads them), and our workers'
// disaggregation inputs when they are there. Pure; one pass over the text, no regular
// expressions per line, so a 50 ms scrape of a large page stays cheap.

import { DRAINING_GAUGE, ESTIMATE_GAUGES, type PrefillModel } from "@airm/rm-core";

/** The load of one model server as its /metrics says. */
export interface ServerLoad {
  /** vllm:num_requests_waiting: requests queued, not yet scheduled. */
  waiting: number;
  /** vllm:num_requests_running: requests holding a slot. */
  running: number;
  /** vllm:kv_cache_usage_perc: share of the KV cache in use, 0-1. */
  kvUsage: number;
  /** Our workers' disaggregation inputs (rm-core ESTIMATE_GAUGES), when they export them and have measured them. */
  estimates?: Estimates;
  /** How the server names its KV blocks, and its worker process (airm_prefix_cache_info), when it exports it. */
  prefixInfo?: PrefixCacheInfo;
  /** vllm:lora_requests_info: the adapters active (running_lora_adapters) and waiting, and max_lora, when it serves adapters (max_lora > 0). */
  lora?: LoraState;
}

/** A server's LoRA adapters as vllm:lora_requests_info says (the series with the latest value). */
export interface LoraState {
  maxLoras: number;
  active: string[];
  waiting: string[];
}

const LORA_INFO = "vllm:lora_requests_info";

/** The adapters a lora_requests_info series names (its value is a time: the latest series wins, as GIE reads it). */
function loraOf(labels: Map<string, string>): LoraState | undefined {
  const maxLoras = Number(labels.get("max_lora"));
  if (!Number.isInteger(maxLoras) || maxLoras <= 0) return undefined;
  const names = (k: string) => (labels.get(k) ?? "").split(",").filter(Boolean);
  return { maxLoras, active: names("running_lora_adapters"), waiting: names("waiting_lora_adapters") };
}

/** airm_prefix_cache_info's labels. */
export interface PrefixCacheInfo {
  modelFingerprint: string;
  numericsFingerprint: string;
  blockSize: number;
  instance: string;
}

const PREFIX_INFO = "airm_prefix_cache_info";

/** The labels of a sample line's label set `{...}` (quotes and escapes honoured). */
function labelsOf(set: string): Map<string, string> {
  const out = new Map<string, string>();
  for (const m of set.matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g))
    out.set(
      m[1],
      m[2].replace(/\\(.)/g, (_, c: string) => (c === "n" ? "\n" : c)),
    );
  return out;
}

/** What an endpoint measured for the disaggregation decision; a field is absent until measured. */
export interface Estimates {
  kvBandwidth?: number;
  kvBytes?: number;
  kvBytesPerToken?: number;
  prefill?: PrefillModel;
  /** A decode endpoint that also prefills whole requests. */
  localPrefill: boolean;
}

const ESTIMATE_OF = new Map<string, keyof typeof ESTIMATE_GAUGES>(Object.entries(ESTIMATE_GAUGES).map(([k, name]) => [name, k as keyof typeof ESTIMATE_GAUGES]));

export const LOAD_METRICS = {
  waiting: "vllm:num_requests_waiting",
  running: "vllm:num_requests_running",
  kvUsage: "vllm:kv_cache_usage_perc",
} as const;

const FIELD_OF = new Map<string, keyof typeof LOAD_METRICS>(Object.entries(LOAD_METRICS).map(([field, name]) => [name, field as keyof typeof LOAD_METRICS]));

/** Index just past the closing "}" of a label set starting at `open` (quotes and escapes honoured), or -1. */
function endOfLabels(text: string, open: number, lineEnd: number): number {
  let inQuote = false;
  for (let i = open + 1; i < lineEnd; i++) {
    const c = text.charCodeAt(i);
    if (inQuote) {
      if (c === 92 /* \ */) i++;
      else if (c === 34 /* " */) inQuote = false;
    } else if (c === 34) inQuote = true;
    else if (c === 125 /* } */) return i + 1;
  }
  return -1;
}

/**
 * The load figures in `text`, each the sum of its samples across label sets. Throws when a
 * figure is missing (the endpoint is then not ready: it is not a model server the picker knows).
 */
export function parseServerLoad(text: string): ServerLoad {
  const sums: Partial<Record<keyof typeof LOAD_METRICS, number>> = {};
  const est: Partial<Record<keyof typeof ESTIMATE_GAUGES, number>> = {};
  let info: PrefixCacheInfo | undefined;
  let lora: { state: LoraState | undefined; at: number } | undefined;
  let pos = 0;
  while (pos < text.length) {
    let lineEnd = text.indexOf("\n", pos);
    if (lineEnd < 0) lineEnd = text.length;
    const first = text.charCodeAt(pos);
    if (first === 118 /* "v": vllm:* */ || first === 97 /* "a": airm_*; comments and other names are skipped */) {
      let nameEnd = pos;
      while (nameEnd < lineEnd) {
        const c = text.charCodeAt(nameEnd);
        if (c === 123 /* { */ || c === 32 || c === 9) break;
        nameEnd++;
      }
      const name = text.slice(pos, nameEnd);
      if (name === PREFIX_INFO && text.charCodeAt(nameEnd) === 123) {
        const end = endOfLabels(text, nameEnd, lineEnd);
        const l = end > 0 ? labelsOf(text.slice(nameEnd, end)) : new Map<string, string>();
        const blockSize = Number(l.get("block_size"));
        if (l.get("model_fingerprint") && l.get("numerics_fingerprint") && l.get("instance") && Number.isInteger(blockSize) && blockSize > 0) {
          info = { modelFingerprint: l.get("model_fingerprint")!, numericsFingerprint: l.get("numerics_fingerprint")!, blockSize, instance: l.get("instance")! };
        }
      }
      if (name === LORA_INFO && text.charCodeAt(nameEnd) === 123) {
        const end = endOfLabels(text, nameEnd, lineEnd);
        const at = end > 0 ? Number(text.slice(end, lineEnd).trim().split(/\s+/)[0]) : Number.NaN;
        if (end > 0 && !(lora && lora.at >= at)) lora = { state: loraOf(labelsOf(text.slice(nameEnd, end))), at };
      }
      // A server that drains takes no new request: the scrape fails, so the picker passes it over.
      if (name === DRAINING_GAUGE && Number(text.slice(nameEnd, lineEnd).trim().split(/\s+/)[0]) === 1) throw new Error(`the server drains (${DRAINING_GAUGE} 1)`);
      const field = FIELD_OF.get(name);
      const estimate = field ? undefined : ESTIMATE_OF.get(name);
      if (field || estimate) {
        const valueStart = text.charCodeAt(nameEnd) === 123 ? endOfLabels(text, nameEnd, lineEnd) : nameEnd;
        if (valueStart < 0) throw new Error(`malformed labels in: ${text.slice(pos, lineEnd)}`);
        const raw = text.slice(valueStart, lineEnd).trim().split(/\s+/)[0];
        const value = Number(raw);
        if (field) {
          if (Number.isNaN(value)) throw new Error(`malformed value in: ${text.slice(pos, lineEnd)}`);
          sums[field] = (sums[field] ?? 0) + value;
        } else if (Number.isFinite(value)) est[estimate!] = value;
        // NaN (prom-client writes "Nan"): not measured yet
        else if (!/^nan$/i.test(raw ?? "")) throw new Error(`malformed value in: ${text.slice(pos, lineEnd)}`);
      }
    }
    pos = lineEnd + 1;
  }
  const missing = Object.entries(LOAD_METRICS)
    .filter(([f]) => sums[f as keyof typeof LOAD_METRICS] === undefined)
    .map(([, name]) => name);
  if (missing.length) throw new Error(`/metrics lacks ${missing.join(", ")}`);
  const load = sums as ServerLoad;
  if (info) load.prefixInfo = info;
  if (lora?.state) load.lora = lora.state;
  if (Object.keys(est).length) {
    load.estimates = {
      localPrefill: est.localPrefill === 1,
      ...(est.kvBandwidth !== undefined ? { kvBandwidth: est.kvBandwidth } : {}),
      ...(est.kvBytes !== undefined ? { kvBytes: est.kvBytes } : {}),
      ...(est.kvBytesPerToken !== undefined ? { kvBytesPerToken: est.kvBytesPerToken } : {}),
      ...(est.prefillFixed !== undefined && est.prefillPerToken !== undefined ? { prefill: { fixedMs: est.prefillFixed * 1000, msPerToken: est.prefillPerToken * 1000 } } : {}),
    };
  }
  return load;
}
