// pnpm bench multi-turn [--model NAME|FILE] [--conversations 8] [--turns 3] [--max-tokens 24] [--routing prefix,load,random] [--llama-server auto|off|PATH]
// Chat conversations as users hold them: N conversations of T turns, each with its own system
// prompt (~110 tokens, seeded), greedy, interleaved (turn 1 of every conversation, then turn 2 of
// every one...; the conversations of a round run at once), through `airm up` (its defaults: one
// prefill and two decode workers) once per gateway routing policy (AIRM_ROUTING). Per run: the
// share of prompt tokens served from a cache (usage.prompt_tokens_details.cached_tokens) against
// the workload's ideal, TTFT p50/p90, output tok/s, and the KV bytes that crossed per request
// (the decode workers' airm_kv_pulled_bytes_total) with those a decode worker held instead. The
// ideal reuses every earlier turn's prompt and answer: for turn t, the longest common prefix of
// its prompt's tokens with turn t-1's prompt and answer (the server's own /tokenize), in whole
// blocks, short of the last token. Then the same conversations on llama.cpp's llama-server
// (--cache-reuse 256, 8 slots, the same GGUF), whose answers report their cached tokens too.
import { flagOf, list, oneOf, text } from "../packages/rm-core/src/index.ts";
import { chooseDefaultModel, resolveModelArg } from "../packages/workload-runner/src/default-model.ts";
import { benchArgs, finalLine } from "./lib.ts";
import { idealShare, kvCounters, type RunResult, row, runConversations, WORKLOAD_FLAGS } from "./multi-turn/conversations.ts";
import { modelId, startAirmUp, stopChild } from "./serve-load/airm-up.ts";
import { ensureLlamaServer, startLlamaServer } from "./serve-load/llama-server.ts";

const args = benchArgs(
  "multi-turn",
  "interleaved multi-turn chat through airm up per routing policy: prefix reuse against the ideal, TTFT, tok/s, KV bytes moved; llama-server beside",
  {
    ...WORKLOAD_FLAGS,
    routing: flagOf(list(oneOf(["prefix", "load", "random"] as const), /,/), { default: ["prefix", "load", "random"], doc: "gateway routing policies to run (AIRM_ROUTING)" }),
    llamaServer: flagOf(text({ label: "auto|off|path" }), { default: "auto", doc: "llama-server: build and cache it when missing (auto), skip it (off), or this binary" }),
  },
);

const chosen = args.model ? await resolveModelArg(args.model, process.env) : await chooseDefaultModel(process.env);
const gguf = chosen.path;
console.log(`model: ${gguf}; ${args.conversations} conversations x ${args.turns} turns, ${args.maxTokens} new tokens, interleaved`);
const results: RunResult[] = [];
let ideal: { all: number; fromTurn2: number } | null = null;
for (const routing of args.routing) {
  const up = await startAirmUp(["--model", gguf], { ...process.env, AIRM_ROUTING: routing });
  try {
    const model = await modelId(up.url);
    const decodes = [0, 1].map((i) => `http://127.0.0.1:${up.decodePort + 2 * i}`);
    const kv0 = await kvCounters(decodes);
    const r = await runConversations(up.url, model, `airm up, routing ${routing}`, args);
    const kv1 = await kvCounters(decodes);
    const pulls = kv1.pulls - kv0.pulls;
    r.kvBytesPerRequest = pulls > 0 ? (kv1.pulled - kv0.pulled) / pulls : null;
    r.kvHeldBytesPerRequest = pulls > 0 ? (kv1.skipped - kv0.skipped) / pulls : null;
    ideal ??= await idealShare(up.url, model, r.turns, args);
    results.push(r);
    console.log(row(r, ideal));
  } finally {
    await stopChild(up.child);
  }
}

let llama: RunResult | null = null;
let llamaSkipped: string | null = null;
const server = await ensureLlamaServer(args.llamaServer);
if ("skipped" in server) {
  llamaSkipped = server.skipped;
  console.log(`llama-server: skipped (${llamaSkipped})`);
} else {
  const { url, child } = await startLlamaServer(server, ["-m", gguf, "-t", "2", "-c", "16384", "-np", "8", "--cache-reuse", "256"]);
  try {
    llama = await runConversations(url, "bench-model", `llama-server ${server.version}`, args);
    console.log(row(llama, null));
  } finally {
    await stopChild(child);
  }
}

console.log("");
console.log("| system                   | cached share all / from turn 2 | TTFT p50 / p90 ms | out tok/s | KV crossed per request | errors |");
console.log("| ------------------------ | ------------------------------ | ----------------- | --------: | ---------------------- | -----: |");
for (const r of results) console.log(row(r, ideal));
if (llama) console.log(row(llama, null));
const slim = (r: RunResult) => ({
  hit_share: r.hitShare,
  hit_share_from_turn2: r.hitShareFromTurn2,
  ttft_p50_ms: r.ttftP50,
  ttft_p90_ms: r.ttftP90,
  tok_s: r.tokS,
  kv_bytes_per_request: r.kvBytesPerRequest,
  kv_held_bytes_per_request: r.kvHeldBytesPerRequest,
  errors: r.errors,
});
finalLine({
  bench: "multi-turn",
  model: gguf,
  conversations: args.conversations,
  turns: args.turns,
  ideal_hit_share: ideal?.all ?? null,
  ideal_hit_share_from_turn2: ideal?.fromTurn2 ?? null,
  ...Object.fromEntries(results.map((r) => [r.system.replace(/\W+/g, "_"), slim(r)])),
  llama_server: llama ? slim(llama) : { skipped: llamaSkipped },
});
