// pnpm bench disagg-grid [--model GGUF] [--rates 100mbit,1gbit,unshaped] [--tokens 16,256] [--n 5]
// Does the disaggregation decision pick the faster path? Four hosts of scripts/netns-rig
// (gateway-node, prefill-node, decode-node, relay-node), KV over tcp through the relay. The
// prefill worker runs with 2 threads and the decode worker (--local-prefill) with 1, so that
// prefilling on the prefill worker is faster than on the decode worker, as on a prefill
// accelerator beside a decode one; both share this machine's 2 cores, one request at a time.
// Three gateways on gateway-node in front of the same workers: --disaggregation always (forced
// PD), never (forced local prefill) and auto (the decision). For each link rate (every host's
// egress shaped with tc tbf, or not at all) and prompt length, in the same run: TTFT p50 of forced
// PD and of forced local (interleaved), then the decision's own requests (after the workers'
// estimates were refreshed by the forced ones, as live traffic would). A cell matches when the
// decision's path is the one with the lower TTFT p50. Prompts are distinct (no prefix cache hits).
// Needs root. Final JSON line: {"bench":"disagg-grid","matches":k,"cells":n,...}.

import type { ChildProcess } from "node:child_process";
import { existsSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath, pathToFileURL } from "node:url";
import { flagOf, int, list, oneOf, text } from "../packages/rm-core/src/index.ts";
import { gatewayArgv } from "../packages/workload-runner/src/rngd-pd-workload.ts";
import { NetnsRig, TBF_RATE } from "../scripts/netns-rig/rig.ts";
import { benchArgs, finalLine, progress, progressDone, sseEvents, summarize } from "./lib.ts";

const self = fileURLToPath(import.meta.url);
const bin = (pkg: string, name: string) => fileURLToPath(new URL(`../packages/${pkg}/bin/${name}.mjs`, import.meta.url));
const DEFAULT_MODEL = join(homedir(), ".cache/airm/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf");
const GATEWAYS = { always: 8000, never: 8001, auto: 8002 } as const;
const SEQ_LEN = 512;
const WORDS =
  "river stone market window garden letter silver morning evening candle harbor meadow bridge lantern valley forest orchard village mountain summer winter autumn spring thunder whisper journey kitchen blanket shadow feather mirror castle engine compass".split(
    " ",
  );

// ---------------------------------------------------------------------------------------------
// The driver: runs in gateway-node (the rig's addresses are reachable only from inside it).

interface Cell {
  rate: string;
  tokens: number;
  n: number;
}

async function driver(gatewayIp: string, decodeUrl: string): Promise<void> {
  const url = (mode: keyof typeof GATEWAYS, path: string) => `http://${gatewayIp}:${GATEWAYS[mode]}${path}`;
  const reply = (o: unknown) => process.stdout.write(`${JSON.stringify(o)}\n`);
  let model = "";
  let tokensPerWord = 1.3;
  let seed = 1;
  const words = (k: number) => Array.from({ length: k }, () => WORDS[(seed = (seed * 1103515245 + 12345) % 2 ** 31) % WORDS.length]).join(" ");
  // distinct word sequences (the generator moves on), one token less for the BOS
  const prompt = (tokens: number) => words(Math.max(1, Math.round((tokens - 1) / tokensPerWord)));
  const ttft = async (mode: keyof typeof GATEWAYS, p: string): Promise<{ ms: number; promptTokens: number }> => {
    const t0 = performance.now();
    const r = await fetch(url(mode, "/v1/completions"), {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model, prompt: p, max_tokens: 4, temperature: 0, stream: true, stream_options: { include_usage: true } }),
    });
    if (!r.ok || !r.body) throw new Error(`${mode}: ${r.status} ${await r.text()}`);
    let ms = Number.NaN;
    let promptTokens = Number.NaN;
    for await (const ev of sseEvents(r.body)) {
      if (Number.isNaN(ms) && ev.choices?.length) ms = performance.now() - t0;
      if (ev.usage) promptTokens = ev.usage.prompt_tokens;
    }
    return { ms, promptTokens };
  };
  const paths = async (): Promise<Record<string, number>> => {
    const t = await (await fetch(url("auto", "/metrics"))).text();
    return Object.fromEntries([...t.matchAll(/^airm_disaggregation_picks_total\{path="(\w+)",reason="(\w+)"\} (\d+)$/gm)].map((m) => [`${m[1]}/${m[2]}`, Number(m[3])]));
  };
  for await (const line of createInterface({ input: process.stdin })) {
    const cmd = JSON.parse(line) as { op: "wait" } | ({ op: "cell" } & Cell) | { op: "exit" };
    if (cmd.op === "exit") break;
    if (cmd.op === "wait") {
      for (const mode of Object.keys(GATEWAYS) as (keyof typeof GATEWAYS)[]) {
        for (let i = 0; ; i++) {
          const h = await fetch(url(mode, "/health")).then(
            (r) => r.json() as Promise<{ status: string }>,
            () => null,
          );
          if (h?.status === "ok") break;
          if (i > 600) throw new Error(`the ${mode} gateway is not healthy after 120 s`);
          await new Promise((r) => setTimeout(r, 200));
        }
      }
      model = ((await (await fetch(url("auto", "/v1/models"))).json()) as { data: { id: string }[] }).data[0]!.id;
      // calibrate words per token on this tokenizer once
      const sample = words(200);
      const tk = (await (
        await fetch(url("auto", "/tokenize"), { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ model, prompt: sample }) })
      ).json()) as {
        count: number;
      };
      tokensPerWord = tk.count / 200;
      reply({ ok: true, model, tokensPerWord });
      continue;
    }
    // forced PD and forced local, interleaved (1 warm-up each), then the decision
    const forced: Record<"always" | "never", number[]> = { always: [], never: [] };
    const promptTokens: number[] = [];
    for (let i = -1; i < cmd.n; i++) {
      for (const mode of ["always", "never"] as const) {
        const r = await ttft(mode, prompt(cmd.tokens));
        if (i >= 0) {
          forced[mode].push(r.ms);
          promptTokens.push(r.promptTokens);
        }
      }
    }
    await new Promise((r) => setTimeout(r, 500)); // the gateways' health probes carry the workers' new estimates
    const before = await paths();
    const auto: number[] = [];
    for (let i = 0; i < cmd.n; i++) auto.push((await ttft("auto", prompt(cmd.tokens))).ms);
    const after = await paths();
    const delta = Object.fromEntries(Object.entries(after).flatMap(([k, v]) => (v - (before[k] ?? 0) > 0 ? [[k, v - (before[k] ?? 0)]] : [])));
    const estimates = ((await (await fetch(`${decodeUrl}/health`)).json()) as { estimates?: unknown }).estimates;
    reply({ forced, auto, paths: delta, promptTokens: summarize(promptTokens).median, estimates });
  }
  process.stdin.destroy();
}

// ---------------------------------------------------------------------------------------------
// The orchestration (caller's namespace).

class Driver {
  private readonly lines: AsyncIterator<string>;
  constructor(readonly proc: ChildProcess) {
    this.lines = createInterface({ input: proc.stdout! })[Symbol.asyncIterator]();
  }
  async ask<T>(cmd: unknown): Promise<T> {
    this.proc.stdin!.write(`${JSON.stringify(cmd)}\n`);
    const r = await this.lines.next();
    if (r.done) throw new Error(`the driver exited (${this.proc.exitCode})`);
    return JSON.parse(r.value) as T;
  }
}

function startCluster(rig: NetnsRig, model: string): void {
  const ip = (h: string) => rig.host(h).address;
  const quiet = { ...process.env, AIRM_LOG_LEVEL: "warn", AIRM_ENGINE_LOG: "0" };
  const env = { ...quiet, AIRM_KV_TRANSPORT: "tcp", AIRM_KV_TCP_ADDR: `${ip("relay-node")}:7400` };
  rig.spawn("relay-node", process.execPath, [bin("kv-relay", "airm-kv-relay"), "--listen", `${ip("relay-node")}:7400`], { stdio: "ignore", env: quiet });
  const worker = (host: string, args: string[]) =>
    rig.spawn(host, process.execPath, [bin("worker", "airm-worker"), "--host", ip(host), "--model", model, "--max-model-len", String(SEQ_LEN), ...args], { stdio: "ignore", env });
  worker("prefill-node", ["--role", "prefill", "--backend", "rngd-full", "--port", "8101", "--threads", "2"]);
  worker("decode-node", ["--role", "decode", "--backend", "atom", "--port", "8102", "--threads", "1", "--local-prefill"]);
  for (const [mode, port] of Object.entries(GATEWAYS)) {
    const gw = gatewayArgv({
      host: ip("gateway-node"),
      port,
      prefill: [`http://${ip("prefill-node")}:8101`],
      decode: [`http://${ip("decode-node")}:8102`],
      localPrefill: true,
      disaggregation: mode as keyof typeof GATEWAYS,
    });
    rig.spawn("gateway-node", gw[0]!, gw.slice(1), { stdio: "ignore", env: { ...quiet, AIRM_HEALTH_INTERVAL_MS: "200" } });
  }
}

const FLAGS = {
  model: flagOf(text({ label: "path" }), { default: DEFAULT_MODEL, doc: "a GGUF or model folder (SmolLM2-135M-Instruct Q4_1 by default)" }),
  rates: flagOf(list(text({ label: "rate" })), { default: ["100mbit", "1gbit", "unshaped"], doc: "link rates (tc tbf), or unshaped" }),
  tokens: flagOf(list(int({ min: 4 })), { default: [16, 256], doc: "prompt lengths in tokens" }),
  n: flagOf(int({ min: 1 }), { default: 5, doc: "requests per mode and cell (after one warm-up of each forced mode)" }),
  role: flagOf(oneOf(["driver"] as const), { doc: "internal: the HTTP driver inside gateway-node" }),
  gateway: flagOf(text({ label: "address" }), { doc: "internal: the gateway host's address" }),
  decodeUrl: flagOf(text({ label: "url" }), { doc: "internal: the decode worker" }),
};

async function main(argv: string[]): Promise<void> {
  const a = benchArgs("disagg-grid", "the disaggregation decision against forced PD and forced local prefill over a grid of link rates and prompt lengths", FLAGS, argv);
  if (a.role === "driver") return driver(a.gateway!, a.decodeUrl!);
  if (process.getuid?.() !== 0) {
    console.error("disagg-grid needs root: it makes network namespaces (CAP_NET_ADMIN)");
    process.exit(2);
  }
  if (!existsSync(a.model)) {
    console.error(`no model at ${a.model}: pass --model (pnpm bench serve-load fetches SmolLM2 into ~/.cache/airm/models)`);
    process.exit(2);
  }
  for (const r of a.rates) if (r !== "unshaped" && !TBF_RATE.test(r)) throw new Error(`--rates: like 100mbit, 1gbit or unshaped, got ${r}`);
  const rig = await NetnsRig.up({ hosts: ["gateway-node", "prefill-node", "decode-node", "relay-node"], link: { rate: "1gbit", burst: "256kb", mtu: 1500 } });
  const cells: Record<string, unknown>[] = [];
  try {
    startCluster(rig, a.model);
    const decodeUrl = `http://${rig.host("decode-node").address}:8102`;
    const d = new Driver(
      rig.spawn("gateway-node", process.execPath, ["--import", "tsx", self, "--role", "driver", "--gateway", rig.host("gateway-node").address, "--decode-url", decodeUrl], {
        stdio: ["pipe", "pipe", "inherit"],
      }),
    );
    const ready = await d.ask<{ model: string; tokensPerWord: number }>({ op: "wait" });
    console.log(
      `model ${ready.model}: ${ready.tokensPerWord.toFixed(2)} tokens per word; prefill worker 2 threads, decode worker 1 thread (--local-prefill); S=${SEQ_LEN}; KV over tcp via the relay host`,
    );
    for (const rate of a.rates) {
      for (const h of rig.hosts.keys()) rig.shape(h, rate);
      for (const tokens of a.tokens) {
        progress(`disagg-grid: ${rate}, ${tokens} tokens`);
        const r = await d.ask<{ forced: { always: number[]; never: number[] }; auto: number[]; paths: Record<string, number>; promptTokens: number; estimates: unknown }>({
          op: "cell",
          rate,
          tokens,
          n: a.n,
        });
        const pd = summarize(r.forced.always).median;
        const local = summarize(r.forced.never).median;
        const faster = pd < local ? "pd" : "local";
        const chosen = Object.entries(r.paths).reduce(
          (acc, [k, v]) => {
            acc[k.split("/")[0] as "pd" | "local"] += v;
            return acc;
          },
          { pd: 0, local: 0 },
        );
        const decision = chosen.pd > chosen.local ? "pd" : "local";
        const cell = {
          rate,
          tokens,
          prompt_tokens: r.promptTokens,
          ttft_pd_ms: pd,
          ttft_local_ms: local,
          faster,
          decision,
          paths: r.paths,
          ttft_auto_ms: summarize(r.auto).median,
          match: decision === faster,
          /** How far apart the two paths are: |PD - local| / the faster (near 0: a tie either path wins by noise). */
          margin: Math.abs(pd - local) / Math.min(pd, local),
          estimates: r.estimates,
        };
        progressDone();
        console.log(
          `${rate.padEnd(9)} ${String(tokens).padStart(4)} tokens (${r.promptTokens}): TTFT p50 PD ${pd.toFixed(0)} ms, local ${local.toFixed(0)} ms -> ${faster}; ` +
            `decision ${JSON.stringify(r.paths)} -> ${decision}, TTFT p50 ${cell.ttft_auto_ms.toFixed(0)} ms: ${cell.match ? "match" : "MISS"} (margin ${(cell.margin * 100).toFixed(0)}%)`,
        );
        cells.push(cell);
      }
    }
    await d.ask({ op: "exit" }).catch(() => {});
  } finally {
    await rig.down();
  }
  const matches = cells.filter((c) => c.match).length;
  console.log(`the decision matched the faster path in ${matches} of ${cells.length} cells`);
  finalLine({ bench: "disagg-grid", model: a.model.split("/").pop(), n: a.n, matches, cells: cells.length, grid: cells });
}

if (process.argv[1] && pathToFileURL(process.argv[1]).href === import.meta.url) await main(process.argv.slice(2));
