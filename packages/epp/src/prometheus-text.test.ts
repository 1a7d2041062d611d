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
