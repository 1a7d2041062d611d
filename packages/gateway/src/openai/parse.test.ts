import { describe, expect, it } from "vitest";
import type { ApiError } from "@airm/internal-api";
import { parseGenerationRequest } from "./parse.ts";
import { REQUEST_FIELDS } from "./request-fields.ts";

const TOOLS = { parser: "hermes" as const };
const parse = (kind: "completion" | "chat", body: unknown, maxContext?: number) => parseGenerationRequest(kind, body, { maxContext, tools: TOOLS });

function err(kind: "completion" | "chat", body: unknown, ctx?: number): ApiError {
  try {
    parse(kind, body, ctx);
  } catch (e) {
    return e as ApiError;
  }
  throw new Error("expected a rejection");
}

describe("parseGenerationRequest", () => {
  it("normalises a completion request", () => {
    const r = parse("completion", { model: "m", prompt: "hi", max_tokens: 5, temperature: 0, seed: 3, stop: "x" }, 512);
    expect(r).toMatchObject({ kind: "completion", model: "m", input: { prompt: "hi" }, maxTokens: 5, sampling: { temperature: 0, seed: 3 }, stop: ["x"], stream: false });
  });
  it("defaults completions to 16 tokens and chat to the rest of the context", () => {
    expect(parse("completion", { model: "m", prompt: "hi" }).maxTokens).toBe(16);
    expect(parse("chat", { model: "m", messages: [{ role: "user", content: "hi" }] }).maxTokens).toBeNull();
  });
  it("accepts token-id prompts and text content parts", () => {
    expect(parse("completion", { model: "m", prompt: [1, 2, 3] }).input).toEqual({ promptTokenIds: [1, 2, 3] });
    const chat = parse("chat", {
      model: "m",
      messages: [
        {
          role: "user",
          content: [
            { type: "text", text: "a" },
            { type: "text", text: "b" },
          ],
        },
      ],
    });
    expect(chat.input).toEqual({ messages: [{ role: "user", content: "ab" }] });
  });
  it("converts OpenAI sampling names to the internal ones, once", () => {
    const r = parse("completion", { model: "m", prompt: "hi", top_p: 0.5, top_k: 7, seed: -1 });
    expect(r.sampling).toEqual({ temperature: 1, topP: 0.5, topK: 7, seed: 0xffffffff });
    expect(parse("completion", { model: "m", prompt: "hi", top_k: -1 }).sampling.topK).toBeUndefined();
  });
  it("rejects bad input with the parameter named", () => {
    expect(err("completion", { model: "m" })).toMatchObject({ status: 400, param: "prompt" });
    expect(err("completion", { model: "m", prompt: "" })).toMatchObject({ status: 400, param: "prompt" });
    expect(err("completion", { model: "m", prompt: "x", max_tokens: "5" })).toMatchObject({ status: 400, param: "max_tokens" });
    expect(err("completion", { model: "m", prompt: "x", max_tokens: 0 })).toMatchObject({ status: 400, param: "max_tokens" });
    expect(err("completion", { model: "m", prompt: "x", max_tokens: 512 }, 512)).toMatchObject({ status: 400, code: "context_overflow" });
    expect(err("completion", { model: "m", prompt: "x", max_tokens: 5_000_000 })).toMatchObject({ status: 400, param: "max_tokens" });
    expect(err("completion", { model: "m", prompt: "x", n: 0 })).toMatchObject({ status: 400, param: "n" });
    expect(err("completion", { model: "m", prompt: "x", n: 3, best_of: 2 })).toMatchObject({ status: 400, param: "best_of" });
    expect(err("completion", { model: "m", prompt: "x", best_of: 3, stream: true })).toMatchObject({ status: 400, param: "best_of" });
    expect(err("chat", { model: "m", messages: [{ role: "user", content: "x" }], best_of: 2 })).toMatchObject({ status: 400, param: "best_of" });
    expect(err("completion", { model: "m", prompt: ["a", ""] })).toMatchObject({ status: 400, param: "prompt" });
    expect(err("chat", { model: "m", messages: [] })).toMatchObject({ status: 400, param: "messages" });
    expect(err("chat", { model: "m", messages: [{ role: "wizard", content: "x" }] })).toMatchObject({ status: 400, param: "messages.0.role" });
    expect(err("chat", { model: 7, messages: [{ role: "user", content: "x" }] })).toMatchObject({ status: 400, param: "model" });
    expect(err("chat", [1, 2])).toMatchObject({ status: 400 });
  });
  it("reads log-probability requests: chat logprobs + top_logprobs (0-20), completions logprobs (0-5) and echo", () => {
    const chat = (extra: object) => ({ model: "m", messages: [{ role: "user", content: "x" }], ...extra });
    expect(parse("chat", chat({})).logprobs).toBeNull();
    expect(parse("chat", chat({ logprobs: true })).logprobs).toBe(0);
    expect(parse("chat", chat({ logprobs: true, top_logprobs: 20 })).logprobs).toBe(20);
    expect(parse("chat", chat({ logprobs: false })).logprobs).toBeNull();
    expect(err("chat", chat({ logprobs: true, top_logprobs: 21 }))).toMatchObject({ status: 400, param: "top_logprobs" });
    expect(err("chat", chat({ top_logprobs: 3 }))).toMatchObject({ status: 400, param: "top_logprobs" });
    expect(err("chat", chat({ echo: true }))).toMatchObject({ status: 400, param: "echo", code: "unsupported_parameter" });
    const c = parse("completion", { model: "m", prompt: "x", logprobs: 5, echo: true });
    expect([c.logprobs, c.echo]).toEqual([5, true]);
    expect(parse("completion", { model: "m", prompt: "x", logprobs: 0 }).logprobs).toBe(0);
    expect(parse("completion", { model: "m", prompt: "x" })).toMatchObject({ logprobs: null, echo: false });
    expect(err("completion", { model: "m", prompt: "x", logprobs: 6 })).toMatchObject({ status: 400, param: "logprobs" });
    expect(err("completion", { model: "m", prompt: "x", logprobs: -1 })).toMatchObject({ status: 400, param: "logprobs" });
  });
  it("says both numbers when max_tokens cannot fit the compiled context", () => {
    expect(err("chat", { model: "m", messages: [{ role: "user", content: "x" }], max_tokens: 600 }, 512).message).toMatch(/600.*512/);
  });
});

describe("structured outputs, tools and the field list", () => {
  const chat = (extra: object) => ({ model: "m", messages: [{ role: "user", content: "x" }], ...extra });
  const weather = { type: "function", function: { name: "get_weather", parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } } };

  it("response_format and structured_outputs become one grammar spec, naming where it came from", () => {
    expect(parse("chat", chat({ response_format: { type: "text" } })).constraint).toBeNull();
    expect(parse("chat", chat({ response_format: { type: "json_object" } })).constraint).toEqual({ spec: { type: "json_object" }, param: "response_format" });
    const js = parse("chat", chat({ response_format: { type: "json_schema", json_schema: { name: "c", schema: { enum: ["a"] }, strict: true } } })).constraint;
    expect(js).toEqual({ spec: { type: "json_schema", schema: '{"enum":["a"]}', anyWhitespace: true }, param: "response_format.json_schema.schema" });
    expect(parse("completion", { model: "m", prompt: "x", structured_outputs: { choice: ["a", "b"] } }).constraint?.spec).toEqual({ type: "choice", choices: ["a", "b"] });
    expect(parse("completion", { model: "m", prompt: "x", structured_outputs: { json: '{"type":"integer"}', disable_any_whitespace: true } }).constraint?.spec).toEqual({
      type: "json_schema",
      schema: '{"type":"integer"}',
      anyWhitespace: false,
    });
    expect(parse("chat", chat({ structured_outputs: { regex: "[a-z]+" } })).constraint).toEqual({ spec: { type: "regex", pattern: "[a-z]+" }, param: "structured_outputs.regex" });
  });

  it("refuses malformed constraints by field", () => {
    expect(err("chat", chat({ response_format: { type: "xml" } }))).toMatchObject({ status: 400, param: "response_format.type" });
    expect(err("chat", chat({ response_format: { type: "xml" } })).message).toMatch(/got "xml"/);
    expect(err("chat", chat({ response_format: { type: "json_schema", json_schema: { schema: {} } } }))).toMatchObject({ param: "response_format.json_schema.name" });
    expect(err("chat", chat({ structured_outputs: { regex: "a", choice: ["b"] } })).message).toMatch(/exactly one.*regex, choice are given/);
    expect(err("chat", chat({ structured_outputs: {} }))).toMatchObject({ param: "structured_outputs" });
    expect(err("chat", chat({ structured_outputs: { whitespace_pattern: " *", json_object: true } }))).toMatchObject({ param: "structured_outputs.whitespace_pattern" });
    expect(err("chat", chat({ response_format: { type: "json_object" }, structured_outputs: { json_object: true } }))).toMatchObject({ param: "structured_outputs" });
    expect(err("chat", chat({ guided_json: { type: "object" } }))).toMatchObject({ param: "guided_json", code: "unsupported_parameter" });
  });

  it("tools: required and named become grammars; auto needs a parser; bad tools are refused by field", () => {
    const req = parse("chat", chat({ tools: [weather], tool_choice: "required", parallel_tool_calls: false }));
    expect(req.toolMode).toEqual({ kind: "required", parallel: false });
    expect(JSON.parse((req.constraint!.spec as { schema: string }).schema)).toMatchObject({ type: "array", minItems: 1, maxItems: 1 });
    expect(req.input).toMatchObject({ tools: [{ name: "get_weather", parameters: weather.function.parameters }] });
    const named = parse("chat", chat({ tools: [weather], tool_choice: { type: "function", function: { name: "get_weather" } } }));
    expect(named.toolMode).toEqual({ kind: "named", name: "get_weather" });
    expect(named.constraint?.param).toBe("tools[0].function.parameters");
    expect(parse("chat", chat({ tools: [weather] })).toolMode).toEqual({ kind: "auto", parser: "hermes", parallel: true });
    expect(() => parseGenerationRequest("chat", chat({ tools: [weather] }), { tools: { parser: null } })).toThrow(/--tool-call-parser/);
    expect(err("chat", chat({ tools: [{ type: "function", function: { parameters: {} } }] }))).toMatchObject({ param: "tools[0].function.name" });
    expect(err("chat", chat({ tools: [{ type: "function", function: { name: "f", parameters: { type: "string" } } }] }))).toMatchObject({ param: "tools[0].function.parameters" });
    expect(err("chat", chat({ tools: [weather], tool_choice: { type: "function", function: { name: "nope" } } }))).toMatchObject({ param: "tool_choice" });
    expect(err("chat", chat({ tool_choice: "required" }))).toMatchObject({ param: "tool_choice" });
    expect(err("chat", chat({ tools: [weather], tool_choice: "required", response_format: { type: "json_object" } }))).toMatchObject({ status: 400, param: "response_format" });
  });

  it("tool calls and tool results in the messages reach the worker", () => {
    const req = parse(
      "chat",
      chat({
        messages: [
          { role: "user", content: "weather?" },
          { role: "assistant", content: null, tool_calls: [{ id: "c1", type: "function", function: { name: "get_weather", arguments: '{"city":"Paris"}' } }] },
          { role: "tool", tool_call_id: "c1", content: "sunny" },
        ],
      }),
    );
    expect(req.input).toEqual({
      messages: [
        { role: "user", content: "weather?" },
        { role: "assistant", content: "", toolCalls: [{ id: "c1", name: "get_weather", arguments: '{"city":"Paris"}' }] },
        { role: "tool", content: "sunny", toolCallId: "c1" },
      ],
    });
    expect(err("chat", chat({ messages: [{ role: "tool", content: "x" }] }))).toMatchObject({ param: "messages[0].tool_call_id" });
  });

  it("logit_bias: token ids within the vocabulary, biases within [-100, 100]", () => {
    const p = (b: object) => parseGenerationRequest("completion", { model: "m", prompt: "x", logit_bias: b }, { vocabSize: 100, tools: TOOLS });
    expect(p({ "5": 10, "7": -100 }).sampling.logitBias).toEqual([
      [5, 10],
      [7, -100],
    ]);
    for (const bad of [{ abc: 5 }, { "-1": 1 }, { "100": 1 }, { "5": 101 }, { "05": 1 }])
      expect(() => p(bad)).toThrow(expect.objectContaining({ status: 400, param: "logit_bias" }));
  });

  it("every field OpenAI or vLLM defines is served, a label, or refused by name; others are ignored", () => {
    // A field neither defines is ignored (as vLLM does) and named for the log; one of the other endpoint is refused.
    expect(parse("chat", chat({ foo: 1, bar: { x: 1 } })).ignored).toEqual(["foo", "bar"]);
    expect(err("completion", { model: "m", prompt: "x", tools: [] })).toMatchObject({ status: 400, param: "tools" });
    expect(err("chat", chat({ prompt: "x" })).message).toMatch(/field of \/v1\/completions/);
    expect(err("completion", { model: "m", prompt: "x", use_beam_search: true })).toMatchObject({ code: "unsupported_parameter", param: "use_beam_search" });
    expect(parse("completion", { model: "m", prompt: "x", ignore_eos: true, min_tokens: 3 })).toMatchObject({ ignoreEos: true, minTokens: 3 });
    expect(err("completion", { model: "m", prompt: "x", ignore_eos: true, structured_outputs: { regex: "a+" } })).toMatchObject({ param: "ignore_eos" });
    expect(err("completion", { model: "m", prompt: "x", max_tokens: 2, min_tokens: 3 })).toMatchObject({ param: "min_tokens" });
    // vLLM's cache_salt: a non-empty string, carried to the workers
    expect(parse("chat", { model: "m", messages: [{ role: "user", content: "hi" }], cache_salt: "tenant-7" })).toMatchObject({ cacheSalt: "tenant-7" });
    expect(parse("completion", { model: "m", prompt: "x" }).cacheSalt).toBeUndefined();
    expect(err("completion", { model: "m", prompt: "x", cache_salt: "" })).toMatchObject({ param: "cache_salt" });
    expect(err("completion", { model: "m", prompt: "x", cache_salt: 7 })).toMatchObject({ param: "cache_salt" });
    // The values that change nothing are accepted.
    expect(parse("chat", chat({ n: 1, presence_penalty: 0, ignore_eos: false, store: false, user: "u1", service_tier: "auto", skip_special_tokens: true })).kind).toBe("chat");
    expect(parse("completion", { model: "m", prompt: "x", add_special_tokens: true, suffix: "" }).kind).toBe("completion");
    expect(err("chat", chat({ add_special_tokens: true }))).toMatchObject({ param: "add_special_tokens" });
    for (const f of REQUEST_FIELDS.filter((x) => x.status === "refused" && !x.neutral)) {
      const body = f.on.includes("chat") ? chat({ [f.name]: "something" }) : { model: "m", prompt: "x", [f.name]: "something" };
      expect(err(f.on.includes("chat") ? "chat" : "completion", body)).toMatchObject({ status: 400, param: f.name });
    }
  });
});

describe("min_p", () => {
  const chatBody = (extra: object) => ({ model: "m", messages: [{ role: "user", content: "x" }], ...extra });
  it("is served on chat and completions in [0, 1]; 0 and null are off", () => {
    for (const kind of ["chat", "completion"] as const) {
      const body = (extra: object) => (kind === "chat" ? chatBody(extra) : { model: "m", prompt: "x", ...extra });
      for (const v of [0.05, 0.5, 1]) expect(parse(kind, body({ min_p: v, temperature: 0.7 })).sampling).toMatchObject({ minP: v, temperature: 0.7 });
      expect(parse(kind, body({ min_p: 0 })).sampling.minP).toBeUndefined();
      expect(parse(kind, body({ min_p: null })).sampling.minP).toBeUndefined();
      expect(parse(kind, body({})).sampling.minP).toBeUndefined();
    }
  });
  it("out of [0, 1] is a 400 naming min_p, in vLLM's words", () => {
    for (const v of [-0.1, 1.5]) {
      for (const [kind, body] of [
        ["chat", chatBody({ min_p: v })],
        ["completion", { model: "m", prompt: "x", min_p: v }],
      ] as const) {
        const e = err(kind, body);
        expect(e).toMatchObject({ status: 400, code: "invalid_request", param: "min_p" });
        expect(e.message).toBe(`min_p must be in [0, 1], got ${v}.`);
      }
    }
    expect(err("chat", chatBody({ min_p: "0.1" }))).toMatchObject({ status: 400, param: "min_p" });
  });
});

describe("the model's generation defaults", () => {
  const defaults = { temperature: 0.7, topP: 0.8, topK: 20, minP: 0.05, repetitionPenalty: 1.05 };
  const withDefaults = (kind: "chat" | "completion", extra: object, d: object | undefined = defaults) =>
    parseGenerationRequest(kind, kind === "chat" ? { model: "m", messages: [{ role: "user", content: "x" }], ...extra } : { model: "m", prompt: "x", ...extra }, {
      generationDefaults: (model) => (model === "m" || model === null ? d : undefined),
      tools: TOOLS,
    }).sampling;

  it("fill the fields a request leaves out (or sets to null)", () => {
    for (const kind of ["chat", "completion"] as const) {
      expect(withDefaults(kind, { seed: 1 })).toEqual({ temperature: 0.7, topP: 0.8, topK: 20, minP: 0.05, repetitionPenalty: 1.05, seed: 1 });
      expect(withDefaults(kind, { seed: 1, temperature: null, top_p: null, top_k: null, min_p: null, repetition_penalty: null })).toEqual({
        temperature: 0.7,
        topP: 0.8,
        topK: 20,
        minP: 0.05,
        repetitionPenalty: 1.05,
        seed: 1,
      });
    }
  });

  it("never win over a value the request gives, neutral ones included", () => {
    expect(withDefaults("chat", { seed: 1, temperature: 0, top_p: 1, top_k: -1, min_p: 0, repetition_penalty: 1 })).toEqual({ temperature: 0, topP: 1, seed: 1 });
    expect(withDefaults("completion", { seed: 2, temperature: 1.2, top_p: 0.5, top_k: 3, min_p: 0.2, repetition_penalty: 1.3 })).toEqual({
      temperature: 1.2,
      topP: 0.5,
      topK: 3,
      minP: 0.2,
      repetitionPenalty: 1.3,
      seed: 2,
    });
    // one field given, the others from the model
    expect(withDefaults("chat", { seed: 3, temperature: 0.1 })).toEqual({ temperature: 0.1, topP: 0.8, topK: 20, minP: 0.05, repetitionPenalty: 1.05, seed: 3 });
  });

  it("are the API's own when the model has none (or another model is named)", () => {
    expect(withDefaults("chat", { seed: 1 }, {})).toEqual({ temperature: 1, seed: 1 });
    expect(withDefaults("chat", { seed: 1, model: "other" })).toEqual({ temperature: 1, seed: 1 });
    // a model's top_k of 0 or -1 is off, as the request's is
    expect(withDefaults("chat", { seed: 1 }, { topK: -1, minP: 0, repetitionPenalty: 1 })).toEqual({ temperature: 1, seed: 1 });
  });
});

describe("n, best_of, batches and penalties", () => {
  it("n and best_of: choices of candidates, bounded by the decode batch width", () => {
    expect(parse("completion", { model: "m", prompt: "x", n: 3 })).toMatchObject({ n: 3, bestOf: 3 });
    expect(parse("completion", { model: "m", prompt: "x", best_of: 4, n: 2 })).toMatchObject({ n: 2, bestOf: 4 });
    const limited = (extra: object) => parseGenerationRequest("completion", { model: "m", prompt: "x", ...extra }, { maxChoices: 16, tools: TOOLS });
    expect(limited({ n: 16 }).n).toBe(16);
    expect(() => limited({ n: 17 })).toThrow(expect.objectContaining({ status: 400, param: "n", message: expect.stringMatching(/at most 16/) }));
    expect(() => limited({ best_of: 17 })).toThrow(expect.objectContaining({ param: "best_of" }));
  });
  it("a completions batch: strings or token-id lists, one generation each", () => {
    expect(parse("completion", { model: "m", prompt: ["a", "b", "c"] }).prompts).toEqual([{ prompt: "a" }, { prompt: "b" }, { prompt: "c" }]);
    expect(parse("completion", { model: "m", prompt: [[1, 2], [3]] }).prompts).toEqual([{ promptTokenIds: [1, 2] }, { promptTokenIds: [3] }]);
    expect(err("completion", { model: "m", prompt: Array(65).fill("a") })).toMatchObject({ param: "prompt" });
  });
  it("penalties become sampling parameters, their neutral values none", () => {
    expect(parse("chat", { model: "m", messages: [{ role: "user", content: "x" }], presence_penalty: 0.5, frequency_penalty: -1, repetition_penalty: 1.2 }).sampling).toMatchObject(
      {
        presencePenalty: 0.5,
        frequencyPenalty: -1,
        repetitionPenalty: 1.2,
      },
    );
    const plain = parse("completion", { model: "m", prompt: "x", presence_penalty: 0, repetition_penalty: 1 }).sampling;
    expect([plain.presencePenalty, plain.repetitionPenalty]).toEqual([undefined, undefined]);
    expect(err("completion", { model: "m", prompt: "x", presence_penalty: 3 })).toMatchObject({ param: "presence_penalty" });
    expect(err("completion", { model: "m", prompt: "x", repetition_penalty: 0 })).toMatchObject({ param: "repetition_penalty" });
  });
});
