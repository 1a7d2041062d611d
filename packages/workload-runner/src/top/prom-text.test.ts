import { describe, expect, test } from "vitest";
import { addHistograms, histogramDelta, histogramOf, histogramQuantile, parseMetrics, sumBy, sumOf } from "./prom-text.ts";

const PAGE = [
  "# HELP airm_gateway_requests_total requests answered by the gateway, by route and HTTP status",
  "# TYPE airm_gateway_requests_total counter",
  'airm_gateway_requests_total{route="/v1/completions",status="200"} 7',
  'airm_gateway_requests_total{route="/v1/chat/completions",status="200"} 3',
  'airm_gateway_requests_total{route="/v1/chat/completions",status="429"} 2',
  'vllm:cache_config_info{block_size="16",note="a \\"quoted\\" value, a comma"} 1',
  "vllm:num_requests_running 4",
  "airm_kv_bandwidth_bytes_per_second NaN",
  'airm_ttft_seconds_bucket{le="0.1"} 2',
  'airm_ttft_seconds_bucket{le="0.5"} 6',
  'airm_ttft_seconds_bucket{le="1"} 8',
  'airm_ttft_seconds_bucket{le="+Inf"} 10',
  "airm_ttft_seconds_sum 9.5",
  "airm_ttft_seconds_count 10",
  "",
].join("\n");

describe("the Prometheus text of a part", () => {
  const m = parseMetrics(PAGE);

  test("samples keep their labels (quotes and commas inside values too) and values", () => {
    expect(m.get("vllm:cache_config_info")?.[0].labels).toEqual({ block_size: "16", note: 'a "quoted" value, a comma' });
    expect(sumOf(m, "vllm:num_requests_running")).toBe(4);
    expect(sumOf(m, "airm_gateway_requests_total")).toBe(12);
    expect(sumOf(m, "airm_gateway_requests_total", { status: "429" })).toBe(2);
    expect(sumBy(m, "airm_gateway_requests_total", "status")).toEqual({ "200": 10, "429": 2 });
  });

  test("a metric the page lacks is null, and a NaN gauge counts as absent", () => {
    expect(sumOf(m, "airm_migrations_total")).toBeNull();
    expect(sumOf(m, "airm_kv_bandwidth_bytes_per_second")).toBeNull();
  });

  test("a histogram is read from its buckets, sum and count", () => {
    const h = histogramOf(m, "airm_ttft_seconds")!;
    expect(h.buckets).toEqual([
      [0.1, 2],
      [0.5, 6],
      [1, 8],
      [Number.POSITIVE_INFINITY, 10],
    ]);
    expect([h.sum, h.count]).toEqual([9.5, 10]);
  });

  test("quantiles interpolate inside the bucket as histogram_quantile does, and stop at the last finite bound", () => {
    const h = histogramOf(m, "airm_ttft_seconds")!;
    // rank 5 of 10 falls in (0.1, 0.5] holding observations 3..6: 0.1 + 0.4 * (5 - 2) / 4
    expect(histogramQuantile(h, 0.5)).toBeCloseTo(0.1 + (0.4 * 3) / 4, 12);
    // rank 1 in the first bucket: from 0
    expect(histogramQuantile(h, 0.1)).toBeCloseTo(0.05, 12);
    // rank 9.5 falls in +Inf: the highest finite bound
    expect(histogramQuantile(h, 0.95)).toBe(1);
    expect(histogramQuantile({ buckets: [[1, 0]], sum: 0, count: 0 }, 0.5)).toBeNull();
  });

  test("the window of a histogram is the difference of its buckets; after a restart, the new counts whole", () => {
    const then = histogramOf(m, "airm_ttft_seconds")!;
    const later = parseMetrics(
      PAGE.replace('le="0.5"} 6', 'le="0.5"} 9').replace('le="1"} 8', 'le="1"} 11').replace('le="+Inf"} 10', 'le="+Inf"} 13').replace("count 10", "count 13"),
    );
    const d = histogramDelta(histogramOf(later, "airm_ttft_seconds")!, then);
    expect(d.buckets.map(([, n]) => n)).toEqual([0, 3, 3, 3]);
    expect(histogramQuantile(d, 0.5)).toBeCloseTo(0.1 + 0.4 * (1.5 / 3), 12);
    const restarted = { buckets: [[0.1, 1] as [number, number]], sum: 0.05, count: 1 };
    expect(histogramDelta(restarted, then)).toBe(restarted);
  });

  test("two gateways' histograms add bucket by bucket", () => {
    const h = histogramOf(m, "airm_ttft_seconds")!;
    const both = addHistograms(h, h)!;
    expect(both.buckets.map(([, n]) => n)).toEqual(h.buckets.map(([, n]) => 2 * n));
    expect(both.count).toBe(2 * h.count);
    expect(addHistograms(null, h)).toBe(h);
  });
});
