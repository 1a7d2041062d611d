// pnpm bench tools [--model NAME|FILE] [--per-category 10] [--categories ...] [--max-tokens 256] [--llama-server auto|off|PATH] [--up-args '...']
// Function-calling accuracy of `airm up` (its defaults: the hermes tool-call parser) and llama.cpp's
// `llama-server --jinja` on the same GGUF in the same run, on the Berkeley Function Calling
// Leaderboard's AST categories (bfcl-eval 2026.3.23 from PyPI): the first N cases of simple_python,
// multiple, parallel, parallel_multiple and irrelevance. Each case is one chat request as BFCL's
// OpenAI handler sends it (its question, its functions as OpenAI tools), tool_choice "auto",
// temperature 0, and each answer's tool_calls are scored with BFCL's AST checker rules
// (bench/tools/bfcl-checker.ts): the right function(s), required parameters, each value among the
// possible answers, parallel calls in any order; irrelevance passes when no call is made.
// The servers run one after the other (2 cores). Besides BFCL's score, each answer's shape is
// reported (tool_calls, a JSON call written as text, plain text) and what the text-written calls
// would score: not BFCL's rule, a diagnostic of models that call tools outside the parser's format.
// Prints a per-case table and per-category accuracy, writes every case to bench/reports/tools/,
// and ends with {"bench":"tools", ...}.
import { existsSync, mkdirSync, writeFileSync } from "node:fs";
import { basename, dirname, join } from "node:path";
import { performance } from "node:perf_hooks";
import { fileURLToPath } from "node:url";
import { resolveCachedModel } from "../packages/llama/src/index.ts";
import { flagOf, int, list, oneOf, text } from "../packages/rm-core/src/index.ts";
import { benchArgs, finalLine, progress, progressDone, summarize } from "./lib.ts";
import { modelId, startAirmUp, stopChild } from "./serve-load/airm-up.ts";
import { ensureLlamaServer, startLlamaServer } from "./serve-load/llama-server.ts";
import { type CheckResult, type ModelAnswer, plain, scoreAnswer } from "./tools/bfcl-checker.ts";
import { BFCL_CATEGORIES, BFCL_VERSION, type BfclCase, type BfclCategory, ensureBfclData, loadCases } from "./tools/bfcl-data.ts";
import { answerShape, textCalls } from "./tools/answer-shape.ts";

const args = benchArgs("tools", "function-calling accuracy (BFCL AST categories) of airm up and llama.cpp's llama-server --jinja on the same GGUF", {
  model: flagOf(text({ label: "name|file" }), { default: "qwen2.5-coder-1.5b-instruct", doc: "a model of the cache (airm model pull NAME) or a .gguf file" }),
  perCategory: flagOf(int({ min: 1, max: 400 }), { default: 10, doc: "cases per category: the first N of each file" }),
  categories: flagOf(list(oneOf(BFCL_CATEGORIES)), { default: [...BFCL_CATEGORIES], doc: "BFCL categories" }),
  maxTokens: flagOf(int({ min: 16 }), { default: 256, doc: "max_tokens of each request" }),
  llamaServer: flagOf(text({ label: "auto|off|path" }), { default: "auto", doc: "llama-server: build and cache it when missing (auto), skip it (off), or this binary" }),
  upArgs: flagOf(text({ label: "flags" }), { default: "--decode-replicas 1", doc: "extra airm up flags (one request at a time: one decode worker is enough)" }),
  report: flagOf(text({ label: "path" }), { defaultText: "bench/reports/tools/<model>.json", doc: "where the per-case JSON goes" }),
});

/** The GGUF of --model: a file as given, else the cached model of that name. */
async function modelFile(m: string): Promise<string> {
  if (existsSync(m)) return m;
  const cached = await resolveCachedModel(m);
  if (!cached) {
    console.error(`tools: ${m} is neither a file nor in the model cache: pnpm exec airm model pull ${m}`);
    process.exit(2);
  }
  return cached.path;
}

interface Answer extends ModelAnswer {
  ok: boolean;
  error?: string;
  finishReason: string | null;
  completionTokens: number;
  ms: number;
}

/** One case as a chat request; a transport or HTTP error is an answer that fails the case. */
async function ask(url: string, model: string, c: BfclCase): Promise<Answer> {
  const t0 = performance.now();
  const empty = { toolCalls: null, content: null, finishReason: null, completionTokens: 0 };
  try {
    const r = await fetch(`${url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model, messages: c.messages, tools: c.tools, tool_choice: "auto", temperature: 0, max_tokens: args.maxTokens }),
    });
    const body = (await r.json()) as any;
    const ms = performance.now() - t0;
    if (!r.ok) return { ok: false, error: `HTTP ${r.status}: ${JSON.stringify(body).slice(0, 300)}`, ...empty, ms };
    const ch = body.choices[0];
    const calls = (ch.message.tool_calls ?? []).map((t: any) => ({ name: t.function.name as string, arguments: t.function.arguments as string }));
    return {
      ok: true,
      toolCalls: calls.length ? calls : null,
      content: ch.message.content ?? null,
      finishReason: ch.finish_reason,
      completionTokens: body.usage?.completion_tokens ?? 0,
      ms,
    };
  } catch (e) {
    return { ok: false, error: (e as Error).message, ...empty, ms: performance.now() - t0 };
  }
}

interface CaseResult {
  id: string;
  category: BfclCategory;
  pass: boolean;
  /** BFCL's checker on the answer's text-written calls (a diagnostic: not BFCL's rule). */
  passAsText: boolean;
  shape: string;
  check: CheckResult;
  answer: Answer;
}

async function runAll(who: string, url: string, model: string, cases: BfclCase[]): Promise<CaseResult[]> {
  const out: CaseResult[] = [];
  for (const [i, c] of cases.entries()) {
    progress(`${who}: ${c.id} (${i + 1}/${cases.length})`);
    const answer = await ask(url, model, c);
    const check = answer.ok ? scoreAnswer(c.category, c.functions, answer, c.groundTruth) : { valid: false, error: [answer.error ?? "failed"], errorType: "request_failed" };
    const asText = answer.ok && !answer.toolCalls ? textCalls(answer.content) : null;
    const passAsText = asText ? scoreAnswer(c.category, c.functions, { toolCalls: asText, content: null }, c.groundTruth).valid : check.valid;
    out.push({ id: c.id, category: c.category, pass: check.valid, passAsText, shape: answerShape(answer), check, answer });
  }
  progressDone();
  return out;
}

interface Score {
  overall: number;
  per_category: Record<string, number>;
  passed: number;
  cases: number;
  overall_if_text_calls_read: number;
  shapes: Record<string, number>;
  median_ms: number;
}

function scoreOf(rs: CaseResult[]): Score {
  const per: Record<string, number> = {};
  for (const cat of args.categories) {
    const xs = rs.filter((r) => r.category === cat);
    per[cat] = xs.filter((r) => r.pass).length / xs.length;
  }
  const shapes: Record<string, number> = {};
  for (const r of rs) shapes[r.shape] = (shapes[r.shape] ?? 0) + 1;
  const passed = rs.filter((r) => r.pass).length;
  return {
    overall: passed / rs.length,
    per_category: per,
    passed,
    cases: rs.length,
    overall_if_text_calls_read: rs.filter((r) => r.passAsText).length / rs.length,
    shapes,
    median_ms: summarize(rs.map((r) => r.answer.ms)).median,
  };
}

const gguf = await modelFile(args.model);
const modelName = basename(gguf).replace(/\.gguf$/, "");
const cases = loadCases(ensureBfclData(), args.categories, args.perCategory);
console.log(`tools: ${cases.length} BFCL ${BFCL_VERSION} cases (the first ${args.perCategory} of ${args.categories.join(", ")}) on ${gguf}`);

// --- airm up
const ours = await startAirmUp(["--model", gguf, ...args.upArgs.split(/\s+/).filter(Boolean)]);
let oursResults: CaseResult[];
try {
  for (const l of ours.config) console.log(l);
  console.log(`airm up: ready in ${ours.startS.toFixed(1)} s`);
  oursResults = await runAll("airm up", ours.url, await modelId(ours.url), cases);
} finally {
  await stopChild(ours.child);
}

// --- llama-server --jinja on the same GGUF: 2 threads (airm up's prefill worker's), one slot (one request at a time)
const LLAMA_ARGS = ["--jinja", "-t", "2", "-c", "8192", "-np", "1"];
let llamaResults: CaseResult[] | null = null;
let llamaVersion: string | null = null;
let llamaSkipped: string | null = null;
const server = await ensureLlamaServer(args.llamaServer);
if ("skipped" in server) {
  llamaSkipped = server.skipped;
  console.log(`llama-server: skipped (${llamaSkipped})`);
} else {
  llamaVersion = server.version;
  const { url, child, startS } = await startLlamaServer(server, [...LLAMA_ARGS, "-m", gguf]);
  try {
    console.log(`llama-server ${server.version} ${LLAMA_ARGS.join(" ")}: ready in ${startS.toFixed(1)} s`);
    llamaResults = await runAll("llama-server", url, modelName, cases);
  } finally {
    await stopChild(child);
  }
}

// --- the table: every case, then per category
const mark = (r: CaseResult | undefined) => (r ? `${r.pass ? "pass" : "FAIL"} ${r.shape}` : "-");
const width = Math.max(...cases.map((c) => c.id.length));
console.log(`\n${"case".padEnd(width)}  ${"airm up".padEnd(22)}  llama-server`);
for (const [i, c] of cases.entries()) console.log(`${c.id.padEnd(width)}  ${mark(oursResults[i]).padEnd(22)}  ${mark(llamaResults?.[i])}`);
const oursScore = scoreOf(oursResults);
const llamaScore = llamaResults ? scoreOf(llamaResults) : null;
const pct = (x: number | undefined) => (x === undefined ? "-" : `${(100 * x).toFixed(0)}%`);
console.log(`\n${"category".padEnd(18)}  airm up  llama-server`);
for (const cat of args.categories) console.log(`${cat.padEnd(18)}  ${pct(oursScore.per_category[cat]).padStart(7)}  ${pct(llamaScore?.per_category[cat]).padStart(12)}`);
console.log(`${"overall".padEnd(18)}  ${pct(oursScore.overall).padStart(7)}  ${pct(llamaScore?.overall).padStart(12)}`);
console.log(`answer shapes: airm up ${JSON.stringify(oursScore.shapes)}; llama-server ${JSON.stringify(llamaScore?.shapes ?? null)}`);
console.log(
  `if calls written as text (a bare JSON call or one in a \`\`\`json fence) were read: airm up ${pct(oursScore.overall_if_text_calls_read)}, llama-server ${pct(llamaScore?.overall_if_text_calls_read)} (not BFCL's rule)`,
);
const same = llamaResults ? cases.filter((_, i) => JSON.stringify(answerKey(oursResults[i])) === JSON.stringify(answerKey(llamaResults![i]))).length : null;
if (same !== null) console.log(`identical answers (content and calls) on both servers: ${same} of ${cases.length}`);

function answerKey(r: CaseResult) {
  return { content: r.answer.content, calls: r.answer.toolCalls?.map((c) => [c.name, JSON.stringify(JSON.parse(c.arguments))]) ?? null };
}

const reportPath = args.report ?? join(dirname(fileURLToPath(import.meta.url)), "reports", "tools", `${modelName}.json`);
mkdirSync(dirname(reportPath), { recursive: true });
const detail = (r: CaseResult) => ({
  pass: r.pass,
  shape: r.shape,
  error: r.check.valid ? undefined : r.check.error,
  error_type: r.check.errorType,
  tool_calls: r.answer.toolCalls,
  content: r.answer.content,
  finish_reason: r.answer.finishReason,
  completion_tokens: r.answer.completionTokens,
  ms: Math.round(r.answer.ms),
});
writeFileSync(
  reportPath,
  `${JSON.stringify(
    {
      bench: "tools",
      bfcl_eval: BFCL_VERSION,
      model: modelName,
      selection: `the first ${args.perCategory} of ${args.categories.join(", ")}`,
      request: { tool_choice: "auto", temperature: 0, max_tokens: args.maxTokens },
      airm_up: { args: args.upArgs, config: ours.config },
      llama_server: llamaSkipped ? { skipped: llamaSkipped } : { version: llamaVersion, args: LLAMA_ARGS.join(" ") },
      cases: cases.map((c, i) => ({
        id: c.id,
        category: c.category,
        question: c.messages.map((m) => m.content).join("\n"),
        ground_truth: c.groundTruth?.map(plain) ?? null,
        airm_up: detail(oursResults[i]),
        llama_server: llamaResults ? detail(llamaResults[i]) : null,
      })),
    },
    null,
    1,
  )}\n`,
);
console.log(`per-case details: ${reportPath}`);

finalLine({
  bench: "tools",
  model: modelName,
  cases: cases.length,
  selection: `first ${args.perCategory} of ${args.categories.join(",")}`,
  accuracy: oursScore.overall,
  ref_accuracy: llamaScore?.overall ?? null,
  ratio: llamaScore && llamaScore.overall > 0 ? oursScore.overall / llamaScore.overall : null,
  median_ms: oursScore.median_ms,
  ref_median_ms: llamaScore?.median_ms ?? null,
  ours: oursScore,
  llama_server: llamaScore ?? { skipped: llamaSkipped },
  identical_answers: same,
});
