// vLLM's --kv-events-config (KVEventsConfig): the JSON that turns a worker's KV events on and says
// where they go. Parsed apart from the publisher (kv-events.ts), which loads zeromq's native addon
// only when events are on.

import { ConfigError } from "@airm/rm-core";

/** vLLM's KVEventsConfig (the fields this publisher reads). */
export interface KvEventsConfig {
  enable_kv_cache_events: boolean;
  publisher: "zmq" | "null";
  endpoint: string;
  replay_endpoint: string | null;
  buffer_steps: number;
  hwm: number;
  topic: string;
}

const DEFAULTS: KvEventsConfig = {
  enable_kv_cache_events: false,
  publisher: "null",
  endpoint: "tcp://*:5557",
  replay_endpoint: null,
  buffer_steps: 10_000,
  hwm: 100_000,
  topic: "",
};

/** Parses --kv-events-config (vLLM's JSON). Throws ConfigError naming the field. */
export function parseKvEventsConfig(json: string): KvEventsConfig {
  let raw: unknown;
  try {
    raw = JSON.parse(json);
  } catch (e) {
    throw new ConfigError("--kv-events-config", `is not JSON: ${(e as Error).message}`);
  }
  if (typeof raw !== "object" || raw === null || Array.isArray(raw)) throw new ConfigError("--kv-events-config", 'must be a JSON object, e.g. {"enable_kv_cache_events": true}');
  const known = new Set([...Object.keys(DEFAULTS), "max_queue_size"]);
  const unknown = Object.keys(raw).filter((k) => !known.has(k));
  if (unknown.length) throw new ConfigError("--kv-events-config", `unknown field(s) ${unknown.join(", ")}; known: ${[...known].join(", ")}`);
  const c = { ...DEFAULTS, ...(raw as Partial<KvEventsConfig>) };
  if (typeof c.enable_kv_cache_events !== "boolean") throw new ConfigError("--kv-events-config.enable_kv_cache_events", "must be true or false");
  // vLLM: enabled means the zmq publisher unless one is named
  if ((raw as Partial<KvEventsConfig>).publisher === undefined) c.publisher = c.enable_kv_cache_events ? "zmq" : "null";
  if (c.publisher !== "zmq" && c.publisher !== "null") throw new ConfigError("--kv-events-config.publisher", `must be "zmq" or "null", got ${JSON.stringify(c.publisher)}`);
  if (typeof c.endpoint !== "string" || !/^(tcp|ipc|inproc):\/\//.test(c.endpoint))
    throw new ConfigError("--kv-events-config.endpoint", "must be a tcp://, ipc:// or inproc:// address");
  if (c.replay_endpoint !== null && (typeof c.replay_endpoint !== "string" || !/^(tcp|ipc|inproc):\/\//.test(c.replay_endpoint))) {
    throw new ConfigError("--kv-events-config.replay_endpoint", "must be null or a tcp://, ipc:// or inproc:// address");
  }
  for (const f of ["buffer_steps", "hwm"] as const) if (!Number.isInteger(c[f]) || c[f] < 1) throw new ConfigError(`--kv-events-config.${f}`, "must be an integer >= 1");
  if (typeof c.topic !== "string") throw new ConfigError("--kv-events-config.topic", "must be a string (llm-d reads kv@<pod>@<model>)");
  return c;
}
