// tool_choice "auto": the answer's text is free, and the gateway's tool-call parser reads the calls
// out of it. A real gateway, the official openai client, and a scripted solo worker that writes a
// scripted answer (as a model trained on the format would: SmolLM2 does not) in small text pieces,
// so the parser meets tags split anywhere. JSON and streamed answers must agree, and plain answers
// stay plain.
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { encodeEvent, type WorkerEvent } from "@airm/internal-api";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startGateway, type RunningGateway } from "../src/index.ts";
import { scriptedHealth } from "./scripted-health.ts";

const MODEL = "scripted";
/** What the scripted model writes next, and what the last generate request asked for. */
const script = { text: "", lastBody: null as Record<string, unknown> | null };
let worker: Server;
const gateways: RunningGateway[] = [];

/** A solo worker that answers every generate with `script.text`, three characters per token event. */
function scriptedWorker(): Promise<string> {
  worker = createServer(async (req, res) => {
    if (req.url === "/health") return res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify(scriptedHealth(MODEL)));
    if (req.url === "/internal/release") return res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ requestId: "x", released: false }));
    let body = "";
    for await (const chunk of req) body += chunk;
    script.lastBody = JSON.parse(body);
    const pieces = script.text.match(/[\s\S]{1,3}/g) ?? [];
    res.writeHead(200, { "content-type": "application/x-ndjson" });
    const ev = (e: WorkerEvent) => res.write(encodeEvent(e));
    ev({ type: "first", token: 1, text: pieces[0] ?? "", eos: false, promptTokens: 3, seqLen: 64, maxTokens: 60, prefillMs: 1 });
    pieces.slice(1).forEach((text, i) => ev({ type: "token", index: i + 1, token: 2, text }));
    res.end(encodeEvent({ type: "done", finishReason: "stop", completionTokens: pieces.length + 1, text: "", decodeMs: 1 }));
  });
  return new Promise((r) => worker.listen(0, "127.0.0.1", () => r(`http://127.0.0.1:${(worker.address() as AddressInfo).port}`)));
}

let client: OpenAI;
beforeAll(async () => {
  const url = await scriptedWorker();
  const gw = await startGateway({ port: 0, solo: [url] });
  gateways.push(gw);
  client = new OpenAI({ baseURL: `${gw.url}/v1`, apiKey: "none", maxRetries: 0 });
});
afterAll(async () => {
  for (const g of gateways) await g.close();
  worker?.close();
});

const tools = [
  { type: "function" as const, function: { name: "get_weather", parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } } },
  { type: "function" as const, function: { name: "get_time", parameters: { type: "object", properties: { zone: { type: "string" } } } } },
];
const messages = [{ role: "user" as const, content: "Weather in Paris, and the time in CET?" }];

async function both(extra: Record<string, unknown> = {}) {
  const json = await client.chat.completions.create({ model: MODEL, messages, tools, ...extra } as OpenAI.Chat.ChatCompletionCreateParamsNonStreaming);
  const stream = await client.chat.completions.create({ model: MODEL, messages, tools, ...extra, stream: true } as OpenAI.Chat.ChatCompletionCreateParamsStreaming);
  const calls: { id: string; name: string; arguments: string }[] = [];
  let content: string | null = null;
  let finish: string | null = null;
  for await (const chunk of stream) {
    const ch = chunk.choices[0];
    if (!ch) continue;
    if (ch.delta.content) content = (content ?? "") + ch.delta.content;
    for (const d of ch.delta.tool_calls ?? []) {
      calls[d.index] ??= { id: "", name: "", arguments: "" };
      calls[d.index].id += d.id ?? "";
      calls[d.index].name += d.function?.name ?? "";
      calls[d.index].arguments += d.function?.arguments ?? "";
    }
    finish = ch.finish_reason ?? finish;
  }
  const msg = json.choices[0].message;
  const plain = (msg.tool_calls ?? []).map((c) => (c.type === "function" ? { name: c.function.name, arguments: c.function.arguments } : null));
  expect(calls.map(({ name, arguments: a }) => ({ name, arguments: a }))).toEqual(plain);
  expect(content).toEqual(msg.content);
  expect(finish).toBe(json.choices[0].finish_reason);
  for (const c of [...calls, ...(msg.tool_calls ?? [])]) expect(c.id).toMatch(/^chatcmpl-tool-[0-9a-f]{32}$/);
  return json;
}

describe('tool_choice "auto" with the hermes parser (the default)', () => {
  it("hermes blocks in the answer become tool_calls, in JSON and in the stream alike", async () => {
    script.text =
      'I will look these up.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>';
    const r = await both();
    expect(r.choices[0].message.tool_calls?.map((c) => (c.type === "function" ? [c.function.name, JSON.parse(c.function.arguments)] : null))).toEqual([
      ["get_weather", { city: "Paris" }],
      ["get_time", { zone: "CET" }],
    ]);
    expect(r.choices[0].message.content).toBe("I will look these up.");
    expect(r.choices[0].finish_reason).toBe("tool_calls");
    // The request took the tools to the worker for its chat template, with no constraint.
    expect(script.lastBody).toMatchObject({ input: { tools: [{ name: "get_weather" }, { name: "get_time" }] } });
    expect(script.lastBody?.constraint).toBeUndefined();
  });

  it("parallel_tool_calls false keeps the first call", async () => {
    const r = await both({ parallel_tool_calls: false });
    expect(r.choices[0].message.tool_calls?.map((c) => (c.type === "function" ? c.function.name : null))).toEqual(["get_weather"]);
  });

  it("an answer without blocks is plain content with finish_reason stop", async () => {
    script.text = "It is sunny in Paris, 21 degrees. <b>Enjoy</b>!";
    const r = await both();
    expect(r.choices[0].message).toMatchObject({ content: script.text });
    expect(r.choices[0].message.tool_calls ?? []).toEqual([]);
    expect(r.choices[0].finish_reason).toBe("stop");
  });

  it("a gateway whose parser is none refuses auto, as vLLM does without --enable-auto-tool-choice", async () => {
    const gw = await startGateway({ port: 0, solo: [`http://127.0.0.1:${(worker.address() as AddressInfo).port}`], toolCallParser: "none" });
    gateways.push(gw);
    const c = new OpenAI({ baseURL: `${gw.url}/v1`, apiKey: "none", maxRetries: 0 });
    const e = await c.chat.completions.create({ model: MODEL, messages, tools }).catch((err: unknown) => err);
    expect(e).toBeInstanceOf(OpenAI.APIError);
    expect((e as InstanceType<typeof OpenAI.APIError>).status).toBe(400);
    expect((e as InstanceType<typeof OpenAI.APIError>).param).toBe("tool_choice");
    expect(((await c.chat.completions.create({ model: MODEL, messages, tools, tool_choice: "none" })).choices[0].message.content ?? "").length).toBeGreaterThan(0);
  });
});
