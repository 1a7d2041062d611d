// pnpm bench tracing [--requests 24] [--max-tokens 16] [--rounds 3] [--seq-len 256]
// What trace export costs a request. Two PD clusters on the same generated 135m-shaped model,
// one exporting every span (OTEL_TRACES_SAMPLER=always_on, OTLP/HTTP protobuf) to a real
// OpenTelemetry Collector on loopback (scripts/otel/build-collector.sh), one without an endpoint
// (the default: the SDK is not even loaded). The same streamed requests, one at a time, in
// rounds that alternate which cluster goes first. Measured at the client: end-to-end latency and
// TTFT. The reference is the untraced cluster in the same run; the spans the collector received
// are counted (8 per PD request when all arrive). Final JSON line:
// {"bench":"tracing","latency_ratio":on/off median,"ttft_ratio":...,"spans_per_request":...}.
import { existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { makeTinyModel } from "../packages/llama/src/index.ts";
import { flagOf, int } from "../packages/rm-core/src/index.ts";
import { startLocalCluster, type RunningCluster } from "../packages/workload-runner/src/index.ts";
import { startCollector } from "../scripts/otel/collector.ts";
import { benchArgs, finalLine, fmt, progress, progressDone, sseEvents, summarize } from "./lib.ts";

const args = benchArgs("tracing", "PD requests with trace export on (to a real collector) and off, in one run", {
  requests: flagOf(int({ min: 1 }), { default: 24, doc: "requests per cluster per round" }),
  maxTokens: flagOf(int({ min: 2 }), { default: 16, doc: "tokens per completion" }),
  rounds: flagOf(int({ min: 1 }), { default: 3, doc: "rounds (alternating which cluster goes first)" }),
  seqLen: flagOf(int({ min: 32 }), { default: 256, doc: "compiled context" }),
});

const model = join(tmpdir(), "airm-bench-135m");
if (!existsSync(join(model, "config.json"))) {
  progress("generating the 135m preset model...");
  makeTinyModel({ arch: "llama", preset: "135m", out: model });
  progressDone();
}

const collector = await startCollector();
const clusterWith = (env: Record<string, string>): Promise<RunningCluster> =>
  startLocalCluster({
    model,
    maxModelLen: args.seqLen,
    port: 0,
    sidecarPort: 0,
    prefill: [{ port: 0 }],
    decode: [{ port: 0 }],
    env: { AIRM_LOG_LEVEL: "warn", AIRM_ENGINE_LOG: "0", ...env },
    readyTimeoutMs: 300_000,
  });
const off = await clusterWith({});
const on = await clusterWith({ OTEL_EXPORTER_OTLP_ENDPOINT: collector.http, OTEL_TRACES_SAMPLER: "always_on" });

/** One streamed completion: end-to-end ms and TTFT ms at the client. */
async function request(c: RunningCluster, i: number): Promise<{ totalMs: number; ttftMs: number }> {
  const t0 = performance.now();
  const r = await fetch(`${c.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ prompt: `Request ${i} asks about the number ${i * 13}:`, max_tokens: args.maxTokens, ignore_eos: true, temperature: 0, stream: true }),
  });
  if (r.status !== 200) throw new Error(`request ${i}: ${r.status} ${await r.text()}`);
  let ttftMs = 0;
  for await (const ev of sseEvents(r.body!)) if (!ttftMs && ev !== "[DONE]") ttftMs = performance.now() - t0;
  return { totalMs: performance.now() - t0, ttftMs };
}

const results = { off: { total: [] as number[], ttft: [] as number[] }, on: { total: [] as number[], ttft: [] as number[] } };
try {
  for (const c of [off, on]) for (let i = 0; i < 2; i++) await request(c, -1 - i); // warm-up
  const warmSpans = collector.spans().length;
  for (let round = 0; round < args.rounds; round++) {
    const order = round % 2 ? (["on", "off"] as const) : (["off", "on"] as const);
    for (const which of order) {
      progress(`round ${round + 1}/${args.rounds}: ${which}`);
      for (let i = 0; i < args.requests; i++) {
        const m = await request(which === "on" ? on : off, i);
        results[which].total.push(m.totalMs);
        results[which].ttft.push(m.ttftMs);
      }
    }
  }
  progressDone();
  // Spans still in the parts' batch processors reach the collector within the schedule delay.
  await new Promise((r) => setTimeout(r, 3000));
  const spans = collector.spans().length - warmSpans;
  const measured = args.requests * args.rounds;
  const s = { off: summarize(results.off.total), on: summarize(results.on.total), offTtft: summarize(results.off.ttft), onTtft: summarize(results.on.ttft) };
  console.log(`latency, export off: ${fmt(s.off)}`);
  console.log(`latency, export on:  ${fmt(s.on)}`);
  console.log(`TTFT, export off:    ${fmt(s.offTtft)}`);
  console.log(`TTFT, export on:     ${fmt(s.onTtft)}`);
  console.log(`spans received: ${spans} for ${measured} requests`);
  finalLine({
    bench: "tracing",
    requests: measured,
    max_tokens: args.maxTokens,
    latency_ms: { off: s.off.median, on: s.on.median },
    ttft_ms: { off: s.offTtft.median, on: s.onTtft.median },
    latency_ratio: s.on.median / s.off.median,
    ttft_ratio: s.onTtft.median / s.offTtft.median,
    overhead_ms: s.on.median - s.off.median,
    spans_per_request: spans / measured,
  });
} finally {
  await on.stop();
  await off.stop();
  await collector.stop();
}
