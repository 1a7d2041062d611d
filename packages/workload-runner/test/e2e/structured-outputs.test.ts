// Structured outputs and tool calls as a user meets them: `airm up` (the real CLI, its defaults:
// PD, one prefill and two decode workers) on the SmolLM2 GGUF, driven with the official openai
// client. JSON answers parse and validate against their schemas (ajv), greedy and sampled; the same
// requests on a solo worker give the same tokens; constrained and unconstrained requests sent
// together give their solo tokens; tool_choice required and named give tool_calls whose arguments
// validate against the tool's parameters, and streamed deltas rebuild the non-streamed answer;
// every bad input is a 400 naming its field. Skipped (with the reason) without the pulled model.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { resolveCachedModel } from "@airm/llama";
import { Ajv } from "ajv";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { freePort, type RunningCluster } from "../../src/index.ts";
import { type AirmUp, startAirmUp, waitFor } from "../helpers/airm-up.ts";
import { cluster } from "../helpers/cluster.ts";

const gguf = (await resolveCachedModel("smollm2-135m-instruct"))?.path;
const SKIP = "the SmolLM2 GGUF is not in the model cache (pnpm exec airm model pull smollm2-135m-instruct)";
if (!gguf) console.warn(`structured outputs e2e skipped: ${SKIP}`);

let up: AirmUp;
let solo: RunningCluster;
let pd: OpenAI;
let ref: OpenAI;
let model: string;
let cache: string;

beforeAll(async () => {
  if (!gguf) return;
  cache = mkdtempSync(join(tmpdir(), "airm-structured-"));
  const [port, pp, dp] = [await freePort(), await freePort(), await freePort()];
  up = startAirmUp(["--model", gguf, "--port", String(port), "--prefill-port", String(pp), "--decode-port", String(dp), "--quiet"], { AIRM_MODEL_CACHE: cache });
  solo = await cluster({ mode: "solo", model: gguf, maxModelLen: 512 });
  await waitFor(() => up.out().includes("rngd-pd is up") || up.child.exitCode !== null, 240_000, "airm up to be ready");
  expect(up.child.exitCode, up.err()).toBeNull();
  pd = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: "none", maxRetries: 0 });
  ref = new OpenAI({ baseURL: `${solo.url}/v1`, apiKey: "none", maxRetries: 0 });
  model = (await pd.models.list()).data[0].id;
}, 300_000);
afterAll(async () => {
  up?.kill();
  await solo?.stop();
  if (cache) rmSync(cache, { recursive: true, force: true });
});

const ajv = new Ajv({ strict: false });
type Params = Omit<OpenAI.Chat.ChatCompletionCreateParamsNonStreaming, "model" | "messages"> & Record<string, unknown>;
const SAMPLINGS: Array<[string, Params]> = [
  ["greedy", { temperature: 0 }],
  ["sampled", { temperature: 0.8, seed: 11 }],
];

function ask(client: OpenAI, content: string, p: Params) {
  return client.chat.completions.create({
    model,
    messages: [{ role: "user", content }],
    max_tokens: 200,
    logprobs: true,
    ...p,
  } as OpenAI.Chat.ChatCompletionCreateParamsNonStreaming);
}

/** The tokens of an answer (its log-probability entries: token text and bytes). */
const tokens = (c: OpenAI.Chat.ChatCompletion) => c.choices[0].logprobs?.content?.map((t) => [t.token, t.bytes]) ?? [];

const SCHEMAS: Array<[string, string, Record<string, unknown>]> = [
  ["an enum", "What color is the sky on a clear day? Answer as JSON.", { type: "object", properties: { color: { enum: ["red", "green", "blue"] } }, required: ["color"] }],
  [
    "nested objects",
    "Describe a person as JSON: name and age, and up to three tags.",
    {
      type: "object",
      properties: {
        person: { type: "object", properties: { name: { type: "string", maxLength: 20 }, age: { type: "integer", minimum: 0, maximum: 120 } }, required: ["name", "age"] },
        tags: { type: "array", items: { type: "string", maxLength: 12 }, maxItems: 3 },
      },
      required: ["person", "tags"],
    },
  ],
  [
    "numbers with ranges",
    "Give today's weather in Paris as JSON: temperature in Celsius and humidity in percent.",
    {
      type: "object",
      properties: { temperature: { type: "number", minimum: -50, maximum: 60 }, humidity: { type: "integer", minimum: 0, maximum: 100 } },
      required: ["temperature", "humidity"],
    },
  ],
  [
    "an array",
    "List two to four items, each with an id from 1 to 9 and whether it is ok, as JSON.",
    {
      type: "object",
      properties: {
        items: {
          type: "array",
          minItems: 2,
          maxItems: 4,
          items: { type: "object", properties: { id: { type: "integer", minimum: 1, maximum: 9 }, ok: { type: "boolean" } }, required: ["id", "ok"] },
        },
      },
      required: ["items"],
    },
  ],
];

const weather = {
  type: "function" as const,
  function: {
    name: "get_weather",
    description: "The current weather in a city",
    parameters: { type: "object", properties: { city: { type: "string", maxLength: 30 }, unit: { enum: ["celsius", "fahrenheit"] } }, required: ["city", "unit"] },
  },
};
const clock = {
  type: "function" as const,
  function: { name: "get_time", description: "The time in a time zone", parameters: { type: "object", properties: { zone: { enum: ["CET", "UTC", "PST"] } }, required: ["zone"] } },
};
const TOOLS = [weather, clock];

/** The tool calls a stream of chunks rebuilds (by index), and its finish reason. */
async function streamed(p: Params & { tools?: unknown; tool_choice?: unknown }, content: string) {
  const stream = await pd.chat.completions.create({
    model,
    messages: [{ role: "user", content }],
    max_tokens: 200,
    ...p,
    stream: true,
  } as OpenAI.Chat.ChatCompletionCreateParamsStreaming);
  const calls: { id?: string; name: string; arguments: string }[] = [];
  let text: string | null = null;
  let finish: string | null = null;
  for await (const chunk of stream) {
    const ch = chunk.choices[0];
    if (!ch) continue;
    if (ch.delta.content) text = (text ?? "") + ch.delta.content;
    for (const d of ch.delta.tool_calls ?? []) {
      calls[d.index] ??= { name: "", arguments: "" };
      if (d.id) calls[d.index].id = d.id;
      if (d.function?.name) calls[d.index].name += d.function.name;
      if (d.function?.arguments) calls[d.index].arguments += d.function.arguments;
    }
    finish = ch.finish_reason ?? finish;
  }
  return { calls, text, finish };
}

describe.skipIf(!gguf)(`structured outputs through airm up (PD) with the openai client${gguf ? "" : ` (skipped: ${SKIP})`}`, { timeout: 600_000 }, () => {
  it("JSON mode: the answers are JSON objects, and solo gives the same tokens", async () => {
    for (const [how, p] of SAMPLINGS) {
      const prompt = "Describe a cat as a JSON object with keys name and age.";
      const got = await ask(pd, prompt, { ...p, response_format: { type: "json_object" } });
      expect(got.choices[0].finish_reason, `${how}: ${got.choices[0].message.content}`).toBe("stop");
      const value = JSON.parse(got.choices[0].message.content!);
      expect(typeof value === "object" && value !== null && !Array.isArray(value)).toBe(true);
      expect(tokens(await ask(ref, prompt, { ...p, response_format: { type: "json_object" } }))).toEqual(tokens(got));
    }
  });

  for (const [name, prompt, schema] of SCHEMAS) {
    it(`json_schema with ${name}: the answers validate, greedy and sampled, and solo gives the same tokens`, async () => {
      const validate = ajv.compile(schema);
      const rf = { type: "json_schema" as const, json_schema: { name: "answer", schema, strict: true } };
      for (const [how, p] of SAMPLINGS) {
        const got = await ask(pd, prompt, { ...p, response_format: rf });
        const text = got.choices[0].message.content!;
        expect(got.choices[0].finish_reason, `${how}: ${text}`).toBe("stop");
        expect(validate(JSON.parse(text)), `${how}: ${text}: ${ajv.errorsText(validate.errors)}`).toBe(true);
        expect(tokens(await ask(ref, prompt, { ...p, response_format: rf })), how).toEqual(tokens(got));
      }
    });
  }

  it("vLLM's structured_outputs: choice and regex hold", async () => {
    const choice = await ask(pd, "Is water wet? Answer yes or no.", { temperature: 0.8, seed: 3, structured_outputs: { choice: ["yes", "no", "it depends"] } });
    expect(["yes", "no", "it depends"]).toContain(choice.choices[0].message.content);
    const regex = await ask(pd, "Give a date.", { temperature: 0.8, seed: 3, structured_outputs: { regex: "20[0-9]{2}-(0[1-9]|1[0-2])-[0-2][0-9]" } });
    expect(regex.choices[0].message.content).toMatch(/^20[0-9]{2}-(0[1-9]|1[0-2])-[0-2][0-9]$/);
  });

  it("constrained and unconstrained requests sent together each give their solo tokens", async () => {
    const schema = SCHEMAS[1][2];
    const rf = { type: "json_schema" as const, json_schema: { name: "answer", schema, strict: true } };
    const jobs = Array.from({ length: 6 }, (_, i) => ({
      prompt: i % 2 ? `Tell me one fact about the number ${i}.` : `Describe person number ${i} as JSON.`,
      p: { temperature: 0.8, seed: 100 + i, max_tokens: 48, ...(i % 2 ? {} : { response_format: rf }) } as Params,
    }));
    const want = [];
    for (const j of jobs) want.push(tokens(await ask(ref, j.prompt, j.p)));
    const got = await Promise.all(jobs.map((j) => ask(pd, j.prompt, j.p)));
    expect(got.map(tokens)).toEqual(want);
  });

  it("tool_choice required and named: tool_calls whose arguments validate; streamed deltas rebuild the answer", async () => {
    const prompt = "What is the weather in Paris, in celsius, and what time is it in CET?";
    for (const choice of ["required", { type: "function", function: { name: "get_time" } }] as const) {
      for (const [how, p] of SAMPLINGS) {
        const params = { ...p, tools: TOOLS, tool_choice: choice } as Params;
        const got = await ask(pd, prompt, params);
        const msg = got.choices[0].message;
        expect(msg.tool_calls?.length, `${how} ${JSON.stringify(choice)}: ${JSON.stringify(msg)}`).toBeGreaterThan(0);
        expect(got.choices[0].finish_reason).toBe(choice === "required" ? "tool_calls" : "stop");
        for (const c of msg.tool_calls ?? []) {
          if (c.type !== "function") throw new Error(`a ${c.type} tool call`);
          const tool = TOOLS.find((t) => t.function.name === c.function.name);
          expect(tool, c.function.name).toBeDefined();
          if (typeof choice === "object") expect(c.function.name).toBe("get_time");
          const validate = ajv.compile(tool!.function.parameters);
          expect(validate(JSON.parse(c.function.arguments)), `${c.function.arguments}: ${ajv.errorsText(validate.errors)}`).toBe(true);
          expect(c.id).toMatch(/^chatcmpl-tool-[0-9a-f]{32}$/);
        }
        const s = await streamed(params, prompt);
        expect(s.finish).toBe(got.choices[0].finish_reason);
        expect(s.text).toBeNull();
        expect(s.calls.map(({ name, arguments: a }) => ({ name, arguments: a }))).toEqual(
          (msg.tool_calls ?? []).map((c) => (c.type === "function" ? { name: c.function.name, arguments: c.function.arguments } : null)),
        );
        for (const c of s.calls) expect(c.id).toMatch(/^chatcmpl-tool-[0-9a-f]{32}$/);
      }
    }
  });

  it("a tool call and its result go back into the next turn", async () => {
    const got = await pd.chat.completions.create({
      model,
      max_tokens: 40,
      temperature: 0,
      tools: TOOLS,
      tool_choice: "none",
      messages: [
        { role: "user", content: "What is the weather in Paris?" },
        {
          role: "assistant",
          content: null,
          tool_calls: [{ id: "call_1", type: "function", function: { name: "get_weather", arguments: '{"city": "Paris", "unit": "celsius"}' } }],
        },
        { role: "tool", tool_call_id: "call_1", content: '{"temperature": 21, "sky": "clear"}' },
      ],
    });
    expect(got.choices[0].message.tool_calls ?? []).toEqual([]);
    expect(got.choices[0].message.content?.length).toBeGreaterThan(0);
    // The tool turn reached the prompt: it is longer than the same conversation without it.
    const without = await pd.chat.completions.create({
      model,
      max_tokens: 1,
      temperature: 0,
      tools: TOOLS,
      tool_choice: "none",
      messages: [{ role: "user", content: "What is the weather in Paris?" }],
    });
    expect(got.usage!.prompt_tokens).toBeGreaterThan(without.usage!.prompt_tokens + 20);
  });

  it("every bad input is a 400 naming its field", async () => {
    const base = { model, messages: [{ role: "user" as const, content: "hi" }], max_tokens: 4 };
    const cases: Array<[Record<string, unknown>, string]> = [
      [{ response_format: { type: "xml" } }, "response_format.type"],
      [{ response_format: { type: "json_schema", json_schema: { name: "x", schema: { type: "nonsense" } } } }, "response_format.json_schema.schema"],
      [{ response_format: { type: "json_schema", json_schema: { name: "x", schema: { type: "integer", multipleOf: 3 } } } }, "response_format.json_schema.schema"],
      [{ tools: [{ type: "function", function: { parameters: { type: "object" } } }] }, "tools[0].function.name"],
      [{ tools: [{ type: "function", function: { name: "f", parameters: { type: "array" } } }] }, "tools[0].function.parameters"],
      [{ tools: TOOLS, tool_choice: { type: "function", function: { name: "not_there" } } }, "tool_choice"],
      [{ logit_bias: { abc: 5 } }, "logit_bias"],
      [{ logit_bias: { "5": 500 } }, "logit_bias"],
      [{ logit_bias: { "10000000": 1 } }, "logit_bias"],
      [{ structured_outputs: { regex: "(ab" } }, "structured_outputs.regex"],
      [{ guided_json: { type: "object" } }, "guided_json"],
    ];
    for (const [extra, param] of cases) {
      const e = await pd.chat.completions.create({ ...base, ...extra } as OpenAI.Chat.ChatCompletionCreateParamsNonStreaming).then(
        () => null,
        (err: unknown) => err,
      );
      expect(e, JSON.stringify(extra)).toBeInstanceOf(OpenAI.APIError);
      expect((e as InstanceType<typeof OpenAI.APIError>).status, JSON.stringify(extra)).toBe(400);
      expect((e as InstanceType<typeof OpenAI.APIError>).param, JSON.stringify(extra)).toBe(param);
    }
    // The cluster still serves.
    expect((await ask(pd, "hi", { temperature: 0, max_tokens: 4 })).choices[0].message.content).toBeTypeOf("string");
  });
});
