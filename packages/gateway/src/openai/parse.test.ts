import { describe, expect, it } from "vitest";
import type { ApiError } from "@airm/internal-api";
import { parseGenerationRequest } from "./parse.ts";

function err(kind: "completion" | "chat", body: unknown, ctx?: number): ApiError {
  try {
    parseGenerationRequest(kind, body, ctx);
  } catch (e) {
    return e as ApiError;
  }
  throw new Error("expected a rejection");
}

describe("parseGenerationRequest", () => {
  it("normalises a completion request", () => {
    const r = parseGenerationRequest("completion", { model: "m", prompt: "hi", max_tokens: 5, temperature: 0, seed: 3, stop: "x" }, 512);
    expect(r).toMatchObject({ kind: "completion", model: "m", input: { prompt: "hi" }, maxTokens: 5, sampling: { temperature: 0, seed: 3 }, stop: ["x"], stream: false });
  });
  it("defaults completions to 16 tokens and chat to the rest of the context", () => {
    expect(parseGenerationRequest("completion", { model: "m", prompt: "hi" }).maxTokens).toBe(16);
    expect(parseGenerationRequest("chat", { model: "m", messages: [{ role: "user", content: "hi" }] }).maxTokens).toBeNull();
  });
  it("accepts token-id prompts and text content parts", () => {
    expect(parseGenerationRequest("completion", { model: "m", prompt: [1, 2, 3] }).input).toEqual({ promptTokenIds: [1, 2, 3] });
    const chat = parseGenerationRequest("chat", {
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
    const r = parseGenerationRequest("completion", { model: "m", prompt: "hi", top_p: 0.5, top_k: 7, seed: -1 });
    expect(r.sampling).toEqual({ temperature: 1, topP: 0.5, topK: 7, seed: 0xffffffff });
    expect(parseGenerationRequest("completion", { model: "m", prompt: "hi", top_k: -1 }).sampling.topK).toBeUndefined();
  });
  it("rejects bad input with the parameter named", () => {
    expect(err("completion", { model: "m" })).toMatchObject({ status: 400, param: "prompt" });
    expect(err("completion", { model: "m", prompt: "" })).toMatchObject({ status: 400, param: "prompt" });
    expect(err("completion", { model: "m", prompt: "x", max_tokens: "5" })).toMatchObject({ status: 400, param: "max_tokens" });
    expect(err("completion", { model: "m", prompt: "x", max_tokens: 0 })).toMatchObject({ status: 400, param: "max_tokens" });
    expect(err("completion", { model: "m", prompt: "x", max_tokens: 512 }, 512)).toMatchObject({ status: 400, code: "context_overflow" });
    expect(err("completion", { model: "m", prompt: "x", max_tokens: 5_000_000 })).toMatchObject({ status: 400, param: "max_tokens" });
    expect(err("completion", { model: "m", prompt: "x", n: 2 })).toMatchObject({ status: 400, param: "n" });
    expect(err("completion", { model: "m", prompt: "x", best_of: 3 })).toMatchObject({ status: 400, param: "best_of" });
    expect(err("completion", { model: "m", prompt: ["a", "b"] })).toMatchObject({ status: 400, param: "prompt" });
    expect(err("chat", { model: "m", messages: [] })).toMatchObject({ status: 400, param: "messages" });
    expect(err("chat", { model: "m", messages: [{ role: "wizard", content: "x" }] })).toMatchObject({ status: 400, param: "messages.0.role" });
    expect(err("chat", { model: 7, messages: [{ role: "user", content: "x" }] })).toMatchObject({ status: 400, param: "model" });
    expect(err("chat", [1, 2])).toMatchObject({ status: 400 });
  });
  it("reads log-probability requests: chat logprobs + top_logprobs (0-20), completions logprobs (0-5) and echo", () => {
    const chat = (extra: object) => ({ model: "m", messages: [{ role: "user", content: "x" }], ...extra });
    expect(parseGenerationRequest("chat", chat({})).logprobs).toBeNull();
    expect(parseGenerationRequest("chat", chat({ logprobs: true })).logprobs).toBe(0);
    expect(parseGenerationRequest("chat", chat({ logprobs: true, top_logprobs: 20 })).logprobs).toBe(20);
    expect(parseGenerationRequest("chat", chat({ logprobs: false })).logprobs).toBeNull();
    expect(err("chat", chat({ logprobs: true, top_logprobs: 21 }))).toMatchObject({ status: 400, param: "top_logprobs" });
    expect(err("chat", chat({ top_logprobs: 3 }))).toMatchObject({ status: 400, param: "top_logprobs" });
    expect(err("chat", chat({ echo: true }))).toMatchObject({ status: 400, param: "echo", code: "unsupported_parameter" });
    const c = parseGenerationRequest("completion", { model: "m", prompt: "x", logprobs: 5, echo: true });
    expect([c.logprobs, c.echo]).toEqual([5, true]);
    expect(parseGenerationRequest("completion", { model: "m", prompt: "x", logprobs: 0 }).logprobs).toBe(0);
    expect(parseGenerationRequest("completion", { model: "m", prompt: "x" })).toMatchObject({ logprobs: null, echo: false });
    expect(err("completion", { model: "m", prompt: "x", logprobs: 6 })).toMatchObject({ status: 400, param: "logprobs" });
    expect(err("completion", { model: "m", prompt: "x", logprobs: -1 })).toMatchObject({ status: 400, param: "logprobs" });
  });
  it("says both numbers when max_tokens cannot fit the compiled context", () => {
    expect(err("chat", { model: "m", messages: [{ role: "user", content: "x" }], max_tokens: 600 }, 512).message).toMatch(/600.*512/);
  });
});
