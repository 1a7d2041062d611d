// pnpm bench epp [--pods N] [--rate R] [--seconds S] [--reps K]
// Decision latency of the endpoint picker (airm-epp) under an open-loop load of R requests/s, each
// a whole ext_proc stream as Envoy sends it (request headers, then a ~1.5 KB chat body ending the
// stream, written by a lean HTTP/2 client so the load generator stays cheap), measured from the
// client's last body message to the answer carrying the destination.
// N fake model servers serve /metrics (half prefill, half decode, so every request makes both
// picks) with different loads; prompts share 16 system prompts so prefix affinity does work.
// Three servers, interleaved over K reps of S/K seconds each after a 1 s warm-up:
//   bin:    the real bin (airm-epp --endpoints-file, static mode) in a child process, as deployed;
//   inproc: the same picker started in this process (startEpp), beside the client;
//   ref:    a trivial ext_proc server in this process that answers with a fixed destination in
//           the same message order: the gRPC round-trip floor (inproc - ref = the picking).
// Final line: {"bench":"epp","p50_ms","p99_ms" (bin),"inproc_p50_ms","inproc_p99_ms","ref_p50_ms",
// "ref_p99_ms","median_ms","ref_median_ms","ratio" (bin p99 / ref p99),"decision_p99_ms_at_most" (the
// bin's own parse+pick time, from its histogram buckets),"rate","requests","errors"}.

import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import os, { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { startEpp, StaticEndpoints } from "../packages/epp/src/index.ts";
import type { Endpoint } from "../packages/routing/src/index.ts";
import { encodeRequest, RawExtProcClient, startFakeModelServer, startFixedExtProc, type FakeModelServer } from "../packages/epp/src/testing/index.ts";
import { flagOf, int } from "../packages/rm-core/src/index.ts";
import { benchArgs, finalLine, progress, progressDone, summarize } from "./lib.ts";

const args = benchArgs("epp", "endpoint picker decision latency at a fixed request rate, against a fixed-answer ext_proc server", {
  pods: flagOf(int({ min: 2, max: 64 }), { default: 4, doc: "fake model servers (half prefill, half decode)" }),
  rate: flagOf(int({ min: 1, max: 20_000 }), { default: 1000, doc: "requests per second (open loop)" }),
  seconds: flagOf(int({ min: 1, max: 600 }), { default: 10, doc: "measured seconds per server, split over the reps" }),
  reps: flagOf(int({ min: 1, max: 20 }), { default: 2, doc: "interleaved repetitions per server" }),
});

const bin = fileURLToPath(new URL("../packages/epp/bin/airm-epp.mjs", import.meta.url));
const SYSTEMS = Array.from({ length: 16 }, (_, i) => `System prompt ${i}: you are assistant number ${i}, answer briefly and cite sources. `.repeat(12));

/** 256 distinct requests, encoded once: the client writes bytes, the picker parses JSON. */
const REQUESTS = Array.from({ length: 256 }, (_, i) => {
  const messages = [
    { role: "system", content: SYSTEMS[i % SYSTEMS.length] },
    { role: "user", content: `question ${i}: what is ${i} times ${i % 97}?` },
  ];
  return encodeRequest(Buffer.from(JSON.stringify({ model: "tiny", messages, max_tokens: 16, stream: true })));
});

function pct(sorted: number[], p: number): number {
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1))];
}

interface Run {
  samples: number[];
  errors: number;
  sent: number;
}

/** Sends `rate` requests/s for `seconds` to `address`, open loop; resolves with each request's decision latency (ms). */
async function drive(address: string, seconds: number, rate: number, label: string): Promise<Run> {
  const envoy = new RawExtProcClient(address);
  const run: Run = { samples: [], errors: 0, sent: 0 };
  const total = Math.round(seconds * rate);
  const inflight = new Set<Promise<void>>();
  const start = performance.now();
  await new Promise<void>((resolve) => {
    const timer = setInterval(() => {
      const due = Math.min(total, Math.floor(((performance.now() - start) * rate) / 1000));
      while (run.sent < due) {
        const i = run.sent++;
        const p = envoy
          .request(REQUESTS[i % REQUESTS.length])
          .then((a) => {
            if (a.status !== 0) run.errors++;
            else run.samples.push(a.decisionMs);
          })
          .catch(() => {
            run.errors++;
          })
          .finally(() => inflight.delete(p));
        inflight.add(p);
      }
      if (run.sent % rate < 2) progress(`${label}: ${run.sent}/${total} sent, ${inflight.size} in flight`);
      if (run.sent >= total) {
        clearInterval(timer);
        resolve();
      }
    }, 1);
  });
  await Promise.all(inflight);
  envoy.close();
  return run;
}

/** The le bound of the Prometheus histogram bucket that holds quantile `q` of airm_epp_decision_duration_ms. */
function bucketQuantile(metricsText: string, q: number): number {
  const buckets = [...metricsText.matchAll(/^airm_epp_decision_duration_ms_bucket\{le="([^"]+)"\} (\d+)$/gm)].map((m) => [Number(m[1]), Number(m[2])] as const);
  const count = buckets.at(-1)?.[1] ?? 0;
  return buckets.find(([, n]) => n >= q * count)?.[0] ?? Number.NaN;
}

/** Starts the bin on a free port; resolves with its ext_proc address and metrics port once it prints its listening line. */
async function spawnBin(file: string): Promise<{ address: string; metricsPort: number; child: ChildProcess }> {
  const child = spawn(process.execPath, [bin, "--endpoints-file", file, "--grpc-port", "0", "--metrics-port", "0", "--health-port", "0", "--log-level", "warn"], {
    stdio: ["ignore", "pipe", "inherit"],
  });
  let out = "";
  const [address, metricsPort] = await new Promise<[string, number]>((resolve, reject) => {
    child.stdout!.on("data", (d) => {
      out += d;
      const m = /listening on (\S+) .*metrics on port (\d+)/.exec(out);
      if (m) resolve([m[1], Number(m[2])]);
    });
    child.once("exit", (code) => reject(new Error(`airm-epp exited with ${code} before listening:\n${out}`)));
  });
  return { address, metricsPort, child };
}

const loadBefore = os
  .loadavg()
  .map((x) => x.toFixed(2))
  .join(" ");
const dir = mkdtempSync(join(tmpdir(), "airm-bench-epp-"));
const pods: FakeModelServer[] = [];
const stops: (() => Promise<void> | void)[] = [];
try {
  for (let i = 0; i < args.pods; i++) pods.push(await startFakeModelServer({ waiting: i % 3, running: 2 + (i % 4), kvUsage: 0.1 + 0.1 * (i % 4) }));
  const endpoints: Endpoint[] = pods.map((p, i) => p.endpoint(i % 2 === 0 ? "prefill" : "decode", `pod-${i}`));
  const file = join(dir, "endpoints.json");
  writeFileSync(file, JSON.stringify(endpoints));

  const child = await spawnBin(file);
  stops.push(() => void child.child.kill("SIGTERM"));
  const inproc = await startEpp({ source: new StaticEndpoints(file), grpcPort: 0, healthPort: null, metricsPort: null });
  stops.push(() => inproc.close());
  await inproc.scraper.settled();
  const ref = await startFixedExtProc(`127.0.0.1:${pods[1].port}`);
  stops.push(() => ref.close());

  const targets = { bin: child.address, inproc: inproc.address, ref: ref.address } as const;
  const results: Record<keyof typeof targets, { samples: number[]; errors: number; sent: number; p99s: number[] }> = {
    bin: { samples: [], errors: 0, sent: 0, p99s: [] },
    inproc: { samples: [], errors: 0, sent: 0, p99s: [] },
    ref: { samples: [], errors: 0, sent: 0, p99s: [] },
  };
  for (const [name, address] of Object.entries(targets)) await drive(address, 1, args.rate, `${name} warm-up`);
  const perRep = args.seconds / args.reps;
  for (let rep = 0; rep < args.reps; rep++) {
    for (const [name, address] of Object.entries(targets) as [keyof typeof targets, string][]) {
      const r = await drive(address, perRep, args.rate, `rep ${rep + 1}/${args.reps} ${name}`);
      const res = results[name];
      res.samples.push(...r.samples);
      res.errors += r.errors;
      res.sent += r.sent;
      res.p99s.push(
        pct(
          [...r.samples].sort((a, b) => a - b),
          99,
        ),
      );
    }
  }
  progressDone();
  const binMetrics = await (await fetch(`http://127.0.0.1:${child.metricsPort}/metrics`)).text();
  const inprocMetrics = await inproc.metrics.registry.metrics();
  const decision = { bin: [bucketQuantile(binMetrics, 0.5), bucketQuantile(binMetrics, 0.99)], inproc: [bucketQuantile(inprocMetrics, 0.5), bucketQuantile(inprocMetrics, 0.99)] };
  const stats = Object.fromEntries(
    Object.entries(results).map(([name, r]) => {
      const s = [...r.samples].sort((a, b) => a - b);
      return [name, { p50: pct(s, 50), p99: pct(s, 99), max: s[s.length - 1], p99s: summarize(r.p99s), n: s.length, errors: r.errors, sent: r.sent }];
    }),
  ) as Record<keyof typeof targets, { p50: number; p99: number; max: number; p99s: ReturnType<typeof summarize>; n: number; errors: number; sent: number }>;
  console.log(
    `load average ${loadBefore} before, ${os
      .loadavg()
      .map((x) => x.toFixed(2))
      .join(" ")} after (${os.cpus().length} cores)`,
  );
  console.log(
    `${args.pods} fake pods (${Math.ceil(args.pods / 2)} prefill, ${Math.floor(args.pods / 2)} decode), ${args.rate} req/s open loop, ${args.seconds} s per server in ${args.reps} reps`,
  );
  for (const [name, s] of Object.entries(stats)) {
    console.log(
      `  ${name.padEnd(6)} p50 ${s.p50.toFixed(3)} ms  p99 ${s.p99.toFixed(3)} ms (per rep ${s.p99s.min.toFixed(3)}-${s.p99s.max.toFixed(3)})  max ${s.max.toFixed(3)} ms  n=${s.n} errors=${s.errors}`,
    );
  }
  console.log(
    `  picker's own decision time (parse + pick, airm_epp_decision_duration_ms buckets): bin p50 <= ${decision.bin[0]} ms, p99 <= ${decision.bin[1]} ms; inproc p50 <= ${decision.inproc[0]} ms, p99 <= ${decision.inproc[1]} ms`,
  );
  finalLine({
    bench: "epp",
    p50_ms: stats.bin.p50,
    p99_ms: stats.bin.p99,
    inproc_p50_ms: stats.inproc.p50,
    inproc_p99_ms: stats.inproc.p99,
    ref_p50_ms: stats.ref.p50,
    ref_p99_ms: stats.ref.p99,
    median_ms: stats.bin.p50,
    ref_median_ms: stats.ref.p50,
    ratio: stats.bin.p99 / stats.ref.p99,
    decision_p99_ms_at_most: decision.bin[1],
    rate: args.rate,
    requests: stats.bin.sent,
    errors: stats.bin.errors + stats.inproc.errors + stats.ref.errors,
  });
} finally {
  for (const stop of stops.reverse()) await stop();
  for (const p of pods) await p.close();
  rmSync(dir, { recursive: true, force: true });
}
