// Reads the three load figures the picker needs out of a model server's Prometheus text
// exposition (vLLM's names, as GIE v1.5.0's metrics extractor reads them). Pure; one pass over
// the text, no regular expressions per line, so a 50 ms scrape of a large page stays cheap.

/** The load of one model server as its /metrics says. */
export interface ServerLoad {
  /** vllm:num_requests_waiting: requests queued, not yet scheduled. */
  waiting: number;
  /** vllm:num_requests_running: requests holding a slot. */
  running: number;
  /** vllm:kv_cache_usage_perc: share of the KV cache in use, 0-1. */
  kvUsage: number;
}

export const LOAD_METRICS = {
  waiting: "vllm:num_requests_waiting",
  running: "vllm:num_requests_running",
  kvUsage: "vllm:kv_cache_usage_perc",
} as const;

const FIELD_OF = new Map<string, keyof ServerLoad>(Object.entries(LOAD_METRICS).map(([field, name]) => [name, field as keyof ServerLoad]));

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
  const sums: Partial<Record<keyof ServerLoad, number>> = {};
  let pos = 0;
  while (pos < text.length) {
    let lineEnd = text.indexOf("\n", pos);
    if (lineEnd < 0) lineEnd = text.length;
    const first = text.charCodeAt(pos);
    if (first === 118 /* "v": only vllm:* lines matter; comments and other names are skipped */) {
      let nameEnd = pos;
      while (nameEnd < lineEnd) {
        const c = text.charCodeAt(nameEnd);
        if (c === 123 /* { */ || c === 32 || c === 9) break;
        nameEnd++;
      }
      const field = FIELD_OF.get(text.slice(pos, nameEnd));
      if (field) {
        const valueStart = text.charCodeAt(nameEnd) === 123 ? endOfLabels(text, nameEnd, lineEnd) : nameEnd;
        if (valueStart < 0) throw new Error(`malformed labels in: ${text.slice(pos, lineEnd)}`);
        const value = Number(text.slice(valueStart, lineEnd).trim().split(/\s+/)[0]);
        if (Number.isNaN(value)) throw new Error(`malformed value in: ${text.slice(pos, lineEnd)}`);
        sums[field] = (sums[field] ?? 0) + value;
      }
    }
    pos = lineEnd + 1;
  }
  const missing = Object.entries(LOAD_METRICS)
    .filter(([f]) => sums[f as keyof ServerLoad] === undefined)
    .map(([, name]) => name);
  if (missing.length) throw new Error(`/metrics lacks ${missing.join(", ")}`);
  return sums as ServerLoad;
}
