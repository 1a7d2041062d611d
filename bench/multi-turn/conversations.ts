// The multi-turn benches' workload: seeded chat conversations, each with its own system prompt
// (about 110 tokens), sent interleaved (turn t of every conversation at once, then turn t+1), and
// what is measured of them: the share of prompt tokens a server took from its cache against the
// workload's ideal, TTFT, output tok/s. Used by `pnpm bench multi-turn` (airm up, llama-server)
// and `pnpm bench multi-turn-rig` (the chart on the Kubernetes rig through Envoy and airm-epp).
import { performance } from "node:perf_hooks";
import { flagOf, int, text } from "../../packages/rm-core/src/index.ts";
import { sseEvents } from "../lib.ts";
import { rng } from "../serve-load/prompts.ts";

export type Msg = { role: "system" | "user" | "assistant"; content: string };

const TOPICS = [
  "gardening",
  "sailing",
  "bread baking",
  "chess openings",
  "bird watching",
  "bicycle repair",
  "astronomy",
  "tea",
  "old maps",
  "jazz piano",
  "beekeeping",
  "rock climbing",
];
const STYLES = ["in plain words", "with one example each time", "briefly and kindly", "like a patient teacher", "with a little humour", "precisely, in short sentences"];
const RULES = [
  "Never give medical or legal advice.",
  "If you are not sure, say so.",
  "Prefer metric units.",
  "Keep lists to three items.",
  "Ask one question back when the request is vague.",
  "Do not repeat the question.",
  "Use the user's name when they give it.",
  "End with a short summary line.",
];
const QUESTIONS = [
  "How do I start?",
  "What should I buy first?",
  "What is the most common mistake?",
  "How long does it take to learn?",
  "Can you give me a plan for a week?",
  "What do experts disagree about?",
];

/** Each conversation's system prompt (about 110 tokens, its own topic and rules) and its questions. */
export function conversations(seed: number, n: number, turns: number): { system: string; questions: string[] }[] {
  const r = rng(seed);
  const pick = <T>(xs: T[]): T => xs[Math.floor(r() * xs.length)]!;
  return Array.from({ length: n }, (_, i) => {
    const topic = TOPICS[i % TOPICS.length]!;
    const rules = Array.from({ length: 6 }, () => pick(RULES)).join(" ");
    const system = `You are assistant number ${i + 1}, an expert on ${topic}, and you answer ${pick(STYLES)}. ${rules} The user is a beginner who wants to learn about ${topic} at home, on a small budget, over the next months. Stay on the topic of ${topic}; if asked about something else, steer back to ${topic} politely.`;
    return { system, questions: Array.from({ length: turns }, () => `${pick(QUESTIONS)} (about ${topic})`) };
  });
}

export interface Turn {
  conv: number;
  turn: number;
  ok: boolean;
  error?: string;
  ttftMs: number;
  promptTokens: number;
  cachedTokens: number;
  tokens: number;
  text: string;
}

async function chat(url: string, model: string, messages: Msg[], maxTokens: number, c: number, t: number, cacheSalt: string | undefined): Promise<Turn> {
  const t0 = performance.now();
  const fail = (error: string): Turn => ({ conv: c, turn: t, ok: false, error, ttftMs: 0, promptTokens: 0, cachedTokens: 0, tokens: 0, text: "" });
  try {
    const r = await fetch(`${url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        model,
        messages,
        max_tokens: maxTokens,
        temperature: 0,
        stream: true,
        stream_options: { include_usage: true },
        ...(cacheSalt ? { cache_salt: cacheSalt } : {}),
      }),
    });
    if (!r.ok || !r.body) return fail(`HTTP ${r.status}: ${(await r.text()).slice(0, 200)}`);
    let first: number | null = null;
    let text = "";
    let usage: { prompt_tokens: number; completion_tokens: number; prompt_tokens_details?: { cached_tokens?: number } } | null = null;
    let llamaCache: number | null = null;
    for await (const j of sseEvents(r.body)) {
      if (j.error) return fail(j.error.message);
      if (j.usage) usage = j.usage;
      // llama-server's own timings: cache_n prompt tokens taken from its cache
      if (j.timings?.cache_n !== undefined) llamaCache = j.timings.cache_n;
      const delta = j.choices?.[0]?.delta?.content;
      if (delta) {
        first ??= performance.now();
        text += delta;
      }
    }
    if (!usage) return fail("no usage arrived");
    const cached = usage.prompt_tokens_details?.cached_tokens ?? llamaCache ?? 0;
    return {
      conv: c,
      turn: t,
      ok: true,
      ttftMs: (first ?? performance.now()) - t0,
      promptTokens: usage.prompt_tokens,
      cachedTokens: cached,
      tokens: usage.completion_tokens,
      text,
    };
  } catch (e) {
    return fail((e as Error).message);
  }
}

export const quantile = (xs: number[], q: number): number => {
  if (xs.length === 0) return Number.NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil(q * s.length) - 1))]!;
};

async function tokenize(url: string, model: string, messages: Msg[], addGenerationPrompt: boolean): Promise<number[]> {
  const r = await fetch(`${url}/tokenize`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model, messages, add_generation_prompt: addGenerationPrompt }),
  });
  if (!r.ok) throw new Error(`/tokenize: HTTP ${r.status}: ${await r.text()}`);
  return ((await r.json()) as { tokens: number[] }).tokens;
}

/** Decode workers' KV counters summed: bytes that crossed, handoffs, bytes held instead. */
export async function kvCounters(urls: string[]): Promise<{ pulled: number; pulls: number; skipped: number }> {
  const out = { pulled: 0, pulls: 0, skipped: 0 };
  for (const u of urls) {
    const m = await (await fetch(`${u}/metrics`)).text();
    const v = (name: string) => Number(new RegExp(`^${name}\\S* (\\S+)$`, "m").exec(m)?.[1] ?? 0);
    out.pulled += v("airm_kv_pulled_bytes_total");
    out.pulls += v("airm_kv_pulls_total");
    out.skipped += v("airm_kv_skipped_bytes_total");
  }
  return out;
}

export interface RunResult {
  system: string;
  requests: number;
  errors: number;
  promptTokens: number;
  cachedTokens: number;
  hitShare: number;
  hitShareFromTurn2: number;
  ttftP50: number;
  ttftP90: number;
  tokS: number;
  kvBytesPerRequest: number | null;
  kvHeldBytesPerRequest: number | null;
  turns: Turn[];
}

/** The flags both benches take for the workload (and the GGUF); `blockSize` is the server's block size, the ideal's unit. */
export const WORKLOAD_FLAGS = {
  model: flagOf(text({ label: "name|file" }), { default: "", doc: "the GGUF: a pulled model's name or a file (default: what `airm up` serves with no --model)" }),
  conversations: flagOf(int({ min: 1, max: 64 }), { default: 8, doc: "conversations" }),
  turns: flagOf(int({ min: 1, max: 16 }), { default: 3, doc: "turns per conversation" }),
  maxTokens: flagOf(int({ min: 2, max: 256 }), { default: 24, doc: "new tokens per answer" }),
  seed: flagOf(int({ min: 0 }), { default: 1, doc: "seed of the system prompts and questions" }),
  blockSize: flagOf(int({ min: 1 }), { default: 16, doc: "the block size the ideal is counted in (the servers' KV block size)" }),
};

/** What a run sends: how many conversations of how many turns (seeded), answers of how many tokens, reuse counted in blocks of what size. */
export interface Workload {
  seed: number;
  conversations: number;
  turns: number;
  maxTokens: number;
  blockSize: number;
}

/**
 * The conversations, interleaved: round t sends turn t of every conversation at once. `cacheSalt`
 * (vLLM's cache_salt) keeps the run from meeting an earlier run's cached blocks on the same servers.
 */
export async function runConversations(url: string, model: string, system: string, args: Workload, cacheSalt?: string): Promise<RunResult> {
  const convs = conversations(args.seed, args.conversations, args.turns);
  const history: Msg[][] = convs.map((c) => [{ role: "system", content: c.system }]);
  const turns: Turn[] = [];
  const t0 = performance.now();
  for (let t = 0; t < args.turns; t++) {
    const round = await Promise.all(
      convs.map((c, i) => {
        history[i]!.push({ role: "user", content: c.questions[t]! });
        return chat(url, model, [...history[i]!], args.maxTokens, i, t, cacheSalt);
      }),
    );
    round.forEach((r, i) => {
      if (!r.ok) console.error(`  ${system}: conversation ${i} turn ${t + 1}: ${r.error}`);
      history[i]!.push({ role: "assistant", content: r.text });
    });
    turns.push(...round);
  }
  const wallS = (performance.now() - t0) / 1000;
  const ok = turns.filter((r) => r.ok);
  const later = ok.filter((r) => r.turn > 0);
  const sum = (xs: Turn[], f: (r: Turn) => number) => xs.reduce((a, r) => a + f(r), 0);
  return {
    system,
    requests: turns.length,
    errors: turns.length - ok.length,
    promptTokens: sum(ok, (r) => r.promptTokens),
    cachedTokens: sum(ok, (r) => r.cachedTokens),
    hitShare: sum(ok, (r) => r.cachedTokens) / sum(ok, (r) => r.promptTokens),
    hitShareFromTurn2: sum(later, (r) => r.cachedTokens) / sum(later, (r) => r.promptTokens),
    ttftP50: quantile(
      ok.map((r) => r.ttftMs),
      0.5,
    ),
    ttftP90: quantile(
      ok.map((r) => r.ttftMs),
      0.9,
    ),
    tokS: sum(ok, (r) => r.tokens) / wallS,
    kvBytesPerRequest: null,
    kvHeldBytesPerRequest: null,
    turns,
  };
}

/** The ideal reuse of the conversations as `url` tokenizes them (every earlier prompt and answer kept). */
export async function idealShare(url: string, model: string, turns: Turn[], args: Workload): Promise<{ all: number; fromTurn2: number }> {
  const convs = conversations(args.seed, args.conversations, args.turns);
  let prompt = 0;
  let ideal = 0;
  let prompt2 = 0;
  let ideal2 = 0;
  for (let i = 0; i < convs.length; i++) {
    const msgs: Msg[] = [{ role: "system", content: convs[i]!.system }];
    let before: number[] = [];
    for (let t = 0; t < args.turns; t++) {
      msgs.push({ role: "user", content: convs[i]!.questions[t]! });
      const ids = await tokenize(url, model, msgs, true);
      let lcp = 0;
      while (lcp < Math.min(ids.length - 1, before.length) && ids[lcp] === before[lcp]) lcp++;
      const reuse = Math.floor(lcp / args.blockSize) * args.blockSize;
      prompt += ids.length;
      ideal += reuse;
      if (t > 0) {
        prompt2 += ids.length;
        ideal2 += reuse;
      }
      const answer = turns.find((r) => r.conv === i && r.turn === t)?.text ?? "";
      msgs.push({ role: "assistant", content: answer });
      before = await tokenize(url, model, msgs, false);
    }
  }
  return { all: ideal / prompt, fromTurn2: ideal2 / prompt2 };
}

export function row(r: RunResult, ideal: { all: number; fromTurn2: number } | null): string {
  const kv = r.kvBytesPerRequest === null ? "-" : `${(r.kvBytesPerRequest / 1e6).toFixed(2)} MB (held ${(r.kvHeldBytesPerRequest! / 1e6).toFixed(2)} MB)`;
  const gap = ideal ? ` (ideal ${ideal.all.toFixed(3)} / ${ideal.fromTurn2.toFixed(3)})` : "";
  return `| ${r.system.padEnd(24)} | ${r.hitShare.toFixed(3)} / ${r.hitShareFromTurn2.toFixed(3)}${gap} | ${r.ttftP50.toFixed(0)} / ${r.ttftP90.toFixed(0)} | ${r.tokS.toFixed(1)} | ${kv} | ${r.errors} |`;
}
