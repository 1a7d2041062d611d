import { Gauge, Registry } from "prom-client";
import { expect, test } from "vitest";
import { parseServerLoad } from "./prometheus-text.ts";

test("sums each gauge across label sets and ignores comments and other metrics", () => {
  const text = [
    "# HELP vllm:num_requests_waiting waiting",
    "# TYPE vllm:num_requests_waiting gauge",
    'vllm:num_requests_waiting{model_name="a",engine="0"} 3',
    'vllm:num_requests_waiting{model_name="b",engine="1"} 4 1700000000000',
    "vllm:num_requests_running 2",
    'vllm:kv_cache_usage_perc{model_name="a"} 0.25',
    'vllm:kv_cache_usage_perc{model_name="b"} 0.5',
    'vllm:num_requests_waiting_total{x="1"} 100',
    "process_cpu_seconds_total 12.5",
  ].join("\n");
  expect(parseServerLoad(text)).toEqual({ waiting: 7, running: 2, kvUsage: 0.75 });
});

test("label values may hold braces, spaces and escaped quotes", () => {
  const text = ['vllm:num_requests_waiting{path="/a b}",q="say \\"}\\" now"} 5', "vllm:num_requests_running{} 1", "vllm:kv_cache_usage_perc 0.1\r", ""].join("\n");
  expect(parseServerLoad(text)).toEqual({ waiting: 5, running: 1, kvUsage: 0.1 });
});

test("a missing gauge or a malformed line is an error naming it", () => {
  expect(() => parseServerLoad("vllm:num_requests_waiting 1\nvllm:num_requests_running 1\n")).toThrow(/vllm:kv_cache_usage_perc/);
  expect(() => parseServerLoad('vllm:num_requests_waiting{a="1" 1\nvllm:num_requests_running 1\nvllm:kv_cache_usage_perc 0\n')).toThrow(/malformed labels/);
  expect(() => parseServerLoad("vllm:num_requests_waiting many\nvllm:num_requests_running 1\nvllm:kv_cache_usage_perc 0\n")).toThrow(/malformed value/);
});

test("our workers' disaggregation estimates are read when present; NaN (not measured yet) leaves a field out", () => {
  const base = "vllm:num_requests_waiting 0\nvllm:num_requests_running 0\nvllm:kv_cache_usage_perc 0\n";
  expect(parseServerLoad(base).estimates).toBeUndefined(); // another server: nothing to read
  const text =
    base +
    'airm_kv_bandwidth_bytes_per_second{role="decode",backend="atom"} 117000000\n' +
    'airm_kv_request_bytes{role="decode",backend="atom"} 67108864\n' +
    'airm_worker_prefill_fixed_seconds{role="decode",backend="atom"} 0.005\n' +
    'airm_worker_prefill_seconds_per_token{role="decode",backend="atom"} 0.001\n' +
    'airm_worker_local_prefill{role="decode",backend="atom"} 1\n';
  expect(parseServerLoad(text).estimates).toEqual({ localPrefill: true, kvBandwidth: 117e6, kvBytes: 67108864, prefill: { fixedMs: 5, msPerToken: 1 } });
  const fresh = `${base}airm_kv_bandwidth_bytes_per_second NaN\nairm_worker_prefill_fixed_seconds NaN\nairm_worker_prefill_seconds_per_token NaN\nairm_worker_local_prefill 0\n`;
  expect(parseServerLoad(fresh).estimates).toEqual({ localPrefill: false });
  expect(() => parseServerLoad(`${base}airm_kv_request_bytes lots\n`)).toThrow(/malformed value/);
});

test("a page rendered by prom-client (our workers' and gateways' library, which writes NaN as Nan) parses", async () => {
  const r = new Registry();
  for (const [name, v] of [
    ["vllm:num_requests_waiting", 1],
    ["vllm:num_requests_running", 2],
    ["vllm:kv_cache_usage_perc", 0.5],
    ["airm_kv_bandwidth_bytes_per_second", Number.NaN],
    ["airm_kv_request_bytes", Number.NaN],
    ["airm_worker_prefill_fixed_seconds", 0.002],
    ["airm_worker_prefill_seconds_per_token", 0.0005],
    ["airm_worker_local_prefill", 1],
  ] as const)
    new Gauge({ name, help: "h", registers: [r] }).set(v);
  const text = await r.metrics();
  expect(text).toMatch(/^airm_kv_bandwidth_bytes_per_second Nan$/m);
  expect(parseServerLoad(text)).toEqual({ waiting: 1, running: 2, kvUsage: 0.5, estimates: { localPrefill: true, prefill: { fixedMs: 2, msPerToken: 0.5 } } });
});

test("a server that says it drains (airm_draining 1) fails the scrape, so it is not picked; 0 is a server like any other", () => {
  const page = (draining: number) =>
    ["# TYPE airm_draining gauge", `airm_draining ${draining}`, "vllm:num_requests_waiting 0", "vllm:num_requests_running 1", "vllm:kv_cache_usage_perc 0.1"].join("\n");
  expect(() => parseServerLoad(page(1))).toThrow(/drains \(airm_draining 1\)/);
  expect(parseServerLoad(page(0))).toEqual({ waiting: 0, running: 1, kvUsage: 0.1 });
});

test("vllm:lora_requests_info: the latest series' adapters and max_lora; none when max_lora is 0", () => {
  const base = "vllm:num_requests_waiting 0\nvllm:num_requests_running 0\nvllm:kv_cache_usage_perc 0\n";
  const info = (max: number, running: string, waiting: string, at: number) =>
    `vllm:lora_requests_info{max_lora="${max}",running_lora_adapters="${running}",waiting_lora_adapters="${waiting}",role="decode"} ${at}\n`;
  expect(parseServerLoad(base + info(4, "sql,chat", "", 100)).lora).toEqual({ maxLoras: 4, active: ["sql", "chat"], waiting: [] });
  // GIE reads the series with the latest value (a time): so does this.
  expect(parseServerLoad(base + info(4, "old", "", 200) + info(4, "new", "w", 300) + info(4, "older", "", 100)).lora).toEqual({ maxLoras: 4, active: ["new"], waiting: ["w"] });
  expect(parseServerLoad(base + info(0, "", "", 100)).lora).toBeUndefined();
  expect(parseServerLoad(base).lora).toBeUndefined();
});
