// Structured outputs in the worker (in-process routes, real engines on a generated tiny model, KV
// over a real shm transport): a constrained request keeps to its grammar (the answers parse and
// validate with ajv), gives in PD exactly the tokens it gives solo (greedy and seeded: the decode
// worker's matcher replays prefill's first token and continues), and a constrained and an
// unconstrained request decoded in one batch each give their solo tokens. The tiny model's weights
// are random, so what it writes inside the grammar is arbitrary: the grammar is what holds it.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { GrammarSpec } from "@airm/grammar";
import { ErrorBodySchema, WorkerEventSchema, type WorkerEvent } from "@airm/internal-api";
import { makeTinyModel } from "@airm/llama";
import { engineForBackend, selectTransport, type KVTransport, type SamplingParams, type WorkerRole } from "@airm/rm-core";
import { Ajv } from "ajv";
import pino from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createWorkerApp, loadServingEngine, WorkerRuntime, type ServingEngine } from "../src/index.ts";

const S = 256;
const root = mkdtempSync(join(tmpdir(), "airm-worker-structured-"));
const model = join(root, "model");
const shmRoot = `/dev/shm/airm-worker-structured-${process.pid}`;
const env = { AIRM_ENGINE_LOG: "0", AIRM_ARTIFACT_CACHE: "off", PD_SHM_ROOT: shmRoot };
const log = pino({ level: "silent" });
const opened: { engine: ServingEngine; transport: KVTransport | null }[] = [];

async function worker(role: WorkerRole, backend: string, batch = 1) {
  const rt = new WorkerRuntime({ role, backend, engineName: engineForBackend(backend, role), maxNumSeqs: batch, leaseTtlMs: 60_000, kvTimeoutMs: 10_000, log });
  const transport = role === "solo" ? null : await selectTransport({ name: "shm", env });
  const engine = await loadServingEngine(rt.engineName, { model, backend, maxModelLen: S, batch }, { env });
  opened.push({ engine, transport });
  rt.markReady({ engine, transport });
  const app = createWorkerApp(rt);
  const post = (path: string, body: unknown) => app.request(path, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
  return { rt, post, engine };
}

async function events(r: Response): Promise<WorkerEvent[]> {
  if (r.status !== 200) throw new Error(`status ${r.status}: ${await r.text()}`);
  return (await r.text())
    .trim()
    .split("\n")
    .map((l) => WorkerEventSchema.parse(JSON.parse(l)));
}

let solo: Awaited<ReturnType<typeof worker>>;
let prefill: Awaited<ReturnType<typeof worker>>;
let decode: Awaited<ReturnType<typeof worker>>;

beforeAll(async () => {
  makeTinyModel({ arch: "llama", out: model, layers: 2, seed: 11 });
  [solo, prefill, decode] = await Promise.all([worker("solo", "rngd"), worker("prefill", "rngd-full"), worker("decode", "atom", 4)]);
});
afterAll(async () => {
  for (const w of [solo, prefill, decode]) await w?.rt.serving?.grammar?.close();
  for (const o of opened) {
    await o.engine.close();
    await o.transport?.close();
  }
  rmSync(root, { recursive: true, force: true });
  rmSync(shmRoot, { recursive: true, force: true });
});

const json = (schema: object): GrammarSpec => ({ type: "json_schema", schema: JSON.stringify(schema), anyWhitespace: false });
const SCHEMAS: Array<[string, object]> = [
  ["an enum", { type: "object", properties: { color: { enum: ["red", "green", "blue"] } }, required: ["color"] }],
  [
    "nested objects with bounded numbers",
    {
      type: "object",
      properties: {
        point: { type: "object", properties: { x: { type: "integer", minimum: -5, maximum: 5 }, y: { type: "number", minimum: 0, maximum: 1.5 } }, required: ["x", "y"] },
        ok: { type: "boolean" },
      },
      required: ["point", "ok"],
    },
  ],
  ["an array", { type: "array", items: { type: "string", maxLength: 3 }, minItems: 1, maxItems: 3 }],
];

/** The solo run of a request: its tokens and text. */
async function soloRun(rid: string, input: object, sampling: SamplingParams, constraint?: GrammarSpec, maxTokens = 120) {
  const evs = await events(await solo.post("/internal/generate", { requestId: rid, input, maxTokens, sampling, constraint }));
  const first = evs.find((e) => e.type === "first") as Extract<WorkerEvent, { type: "first" }>;
  return collect(first.token, first.text, evs);
}

function collect(first: number, firstText: string, evs: WorkerEvent[]) {
  const done = evs.find((e) => e.type === "done") as Extract<WorkerEvent, { type: "done" }> | undefined;
  if (!done) throw new Error(`no done event: ${JSON.stringify(evs.at(-1))}`);
  const tokens = [first, ...evs.flatMap((e) => (e.type === "token" ? [e.token] : []))];
  const text = firstText + evs.map((e) => (e.type === "token" ? e.text : "")).join("") + done.text;
  return { tokens, text, finish: done.finishReason };
}

/** The PD run: decode called first (it waits for the KV), then prefill. */
async function pdRun(rid: string, input: object, sampling: SamplingParams, constraint?: GrammarSpec, maxTokens = 120) {
  const dec = decode.post("/internal/decode", { requestId: rid, maxTokens, sampling, constraint });
  const pre = await prefill.post("/internal/prefill", { requestId: rid, input, maxTokens, sampling, constraint });
  expect(pre.status).toBe(200);
  const answer = (await pre.json()) as { first: { token: number; text: string } };
  return collect(answer.first.token, answer.first.text, await events(await dec));
}

const ajv = new Ajv({ strict: false });
const SAMPLINGS: SamplingParams[] = [{ temperature: 0 }, { temperature: 1, seed: 4242 }];

describe("structured outputs in the worker", () => {
  for (const [name, schema] of SCHEMAS) {
    it(`${name}: the answer validates, and PD gives the solo tokens (greedy and seeded)`, async () => {
      const validate = ajv.compile(schema);
      for (const [i, sampling] of SAMPLINGS.entries()) {
        const input = { prompt: `give ${name}` };
        const want = await soloRun(`solo-${name.length}-${i}`, input, sampling, json(schema));
        expect(want.finish).toBe("stop");
        const value = JSON.parse(want.text);
        expect(validate(value), `${want.text}: ${ajv.errorsText(validate.errors)}`).toBe(true);
        const got = await pdRun(`pd-${name.length}-${i}`, input, sampling, json(schema));
        expect(got.tokens).toEqual(want.tokens);
      }
    });
  }

  it("choice and regex hold in PD and solo alike", async () => {
    const specs: GrammarSpec[] = [
      { type: "choice", choices: ["alpha", "beta gamma", "δ"] },
      { type: "regex", pattern: "[0-9]{3}-[a-z]{2,4}" },
    ];
    for (const [i, spec] of specs.entries()) {
      const want = await soloRun(`solo-c${i}`, { prompt: "pick" }, { temperature: 1, seed: 9 }, spec);
      if (spec.type === "choice") expect(spec.choices).toContain(want.text);
      else expect(want.text).toMatch(/^[0-9]{3}-[a-z]{2,4}$/);
      expect((await pdRun(`pd-c${i}`, { prompt: "pick" }, { temperature: 1, seed: 9 }, spec)).tokens).toEqual(want.tokens);
    }
  });

  it("a constrained and an unconstrained request decoded in one batch each give their solo tokens", async () => {
    const schema = SCHEMAS[1][1];
    const sampling: SamplingParams = { temperature: 1, seed: 31 };
    const a = await soloRun("solo-mix-a", { prompt: "mixed batch a" }, sampling, json(schema), 60);
    const b = await soloRun("solo-mix-b", { prompt: "mixed batch b" }, sampling, undefined, 60);
    const before = (await decode.rt.metrics.decodeBatch.get()).values.find((v) => v.metricName?.endsWith("_sum"))?.value ?? 0;
    const steps = (await decode.rt.metrics.decodeBatch.get()).values.find((v) => v.metricName?.endsWith("_count"))?.value ?? 0;
    // Both prompts prefill first and their KV waits in the transport; then both decodes start
    // together, so they share steps however slow the machine is.
    const requests = [
      { requestId: "pd-mix-a", input: { prompt: "mixed batch a" }, constraint: json(schema) },
      { requestId: "pd-mix-b", input: { prompt: "mixed batch b" }, constraint: undefined },
    ];
    const firsts: { token: number; text: string }[] = [];
    for (const r of requests) {
      const pre = await prefill.post("/internal/prefill", { ...r, maxTokens: 60, sampling });
      expect(pre.status).toBe(200);
      firsts.push(((await pre.json()) as { first: { token: number; text: string } }).first);
    }
    const [ga, gb] = await Promise.all(
      requests.map(async (r, i) =>
        collect(
          firsts[i]!.token,
          firsts[i]!.text,
          await events(await decode.post("/internal/decode", { requestId: r.requestId, maxTokens: 60, sampling, constraint: r.constraint })),
        ),
      ),
    );
    expect(ga.tokens).toEqual(a.tokens);
    expect(gb.tokens).toEqual(b.tokens);
    // They shared steps: with at most two streams, each step that held both adds one to the
    // streams' sum over the step count. (How many depends on when the second KV arrived and on
    // where the shorter answer ends, so the bound is small.)
    const after = await decode.rt.metrics.decodeBatch.get();
    const sum = (after.values.find((v) => v.metricName?.endsWith("_sum"))?.value ?? 0) - before;
    const count = (after.values.find((v) => v.metricName?.endsWith("_count"))?.value ?? 0) - steps;
    expect(sum - count).toBeGreaterThanOrEqual(3);
    expect(decode.rt.serving?.grammar?.stats.masks).toBeGreaterThan(0);
  });

  it("a bad constraint is a 400 naming it, on each route", async () => {
    const bad = json({ type: "integer", multipleOf: 3 });
    for (const [route, body] of [
      ["/internal/generate", { requestId: "bad-1", input: { prompt: "x" }, maxTokens: 4, constraint: bad }],
      ["/internal/prefill", { requestId: "bad-2", input: { prompt: "x" }, maxTokens: 4, constraint: bad }],
    ] as const) {
      const w = route === "/internal/generate" ? solo : prefill;
      const r = await w.post(route, body);
      expect(r.status).toBe(400);
      const e = ErrorBodySchema.parse(await r.json()).error;
      expect(e.param).toBe("constraint");
      expect(e.message).toMatch(/multipleOf/);
    }
    const r = await decode.post("/internal/decode", { requestId: "bad-3", maxTokens: 4, kvTimeoutMs: 50, constraint: bad });
    expect(r.status).toBe(400);
    expect(ErrorBodySchema.parse(await r.json()).error.param).toBe("constraint");
  });
});

describe("logit_bias, min_tokens and ignore_eos in the worker", () => {
  const eos = () => solo.engine.model.eosTokenIds[0];
  /** Greedy with the end-of-sequence id pushed up by 100: it wins every step it may. */
  const pushed = (): SamplingParams => ({ temperature: 0, logitBias: [[eos(), 100]] });

  it("logit_bias moves the choice; min_tokens holds the end back; ignore_eos runs past it to max_tokens (PD as solo)", async () => {
    const input = { prompt: "controls" };
    const plain = await soloRun("lb-0", input, pushed(), undefined, 20);
    expect([plain.tokens, plain.finish]).toEqual([[eos()], "stop"]);
    const held = await soloRun("lb-1", input, pushed(), undefined, 20);
    expect(held.tokens).toEqual(plain.tokens);
    const evs = await events(await solo.post("/internal/generate", { requestId: "lb-2", input, maxTokens: 20, sampling: pushed(), minTokens: 5 }));
    const first = evs.find((e) => e.type === "first") as Extract<WorkerEvent, { type: "first" }>;
    const min = collect(first.token, first.text, evs);
    expect(min.tokens).toHaveLength(5);
    expect(min.tokens).not.toContain(eos());
    expect(min.finish).toBe("stop");
    const dec = decode.post("/internal/decode", { requestId: "lb-3", maxTokens: 20, sampling: pushed(), minTokens: 5 });
    await prefill.post("/internal/prefill", { requestId: "lb-3", input, maxTokens: 20, sampling: pushed(), minTokens: 5 });
    expect(tokensAfter(first.token, await events(await dec))).toEqual(min.tokens.slice(1));
    const ign = await events(await solo.post("/internal/generate", { requestId: "lb-4", input, maxTokens: 7, sampling: pushed(), ignoreEos: true }));
    const firstIgn = ign.find((e) => e.type === "first") as Extract<WorkerEvent, { type: "first" }>;
    const all = collect(firstIgn.token, firstIgn.text, ign);
    expect(all.tokens).toEqual(Array(7).fill(eos()));
    expect(all.finish).toBe("length");
  });

  it("a logit_bias id outside the vocabulary is a 400 naming it", async () => {
    const r = await solo.post("/internal/generate", { requestId: "lb-5", input: { prompt: "x" }, maxTokens: 2, sampling: { logitBias: [[10_000_000, 1]] } });
    expect(r.status).toBe(400);
    expect(ErrorBodySchema.parse(await r.json()).error.param).toBe("logit_bias");
  });
});

function tokensAfter(_first: number, evs: WorkerEvent[]): number[] {
  return evs.flatMap((e) => (e.type === "token" ? [e.token] : []));
}
