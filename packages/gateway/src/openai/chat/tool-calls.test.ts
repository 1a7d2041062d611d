import { describe, expect, it } from "vitest";
import { type AnswerPiece, ToolCallReader } from "./tool-calls.ts";
import type { ToolMode } from "./tools.ts";

/** What a client rebuilds from the pieces: content, and calls by index (ids left out: they are random). */
function rebuild(pieces: AnswerPiece[]): { content: string; calls: { name: string; arguments: string }[] } {
  let content = "";
  const calls: { name: string; arguments: string }[] = [];
  for (const p of pieces) {
    if ("content" in p) content += p.content;
    else if ("callStart" in p) calls[p.callStart.index] = { name: p.callStart.name, arguments: "" };
    else calls[p.callArgs.index].arguments += p.callArgs.fragment;
  }
  return { content, calls };
}

/** The answer read whole, and read in pieces of `size` characters: both must give the same message. */
function read(mode: ToolMode, text: string, size: number, finish: "stop" | "length" = "stop") {
  const run = (chunks: string[]) => {
    const r = new ToolCallReader(mode);
    const pieces = chunks.flatMap((c) => r.push(c));
    const end = r.finish(finish);
    const rebuilt = rebuild([...pieces, ...end.pieces]);
    return { rebuilt, finish: end.finishReason, content: r.messageContent(), calls: r.calls.map(({ name, arguments: a }) => ({ name, arguments: a })) };
  };
  const whole = run([text]);
  const parts: string[] = [];
  for (let i = 0; i < text.length; i += size) parts.push(text.slice(i, i + size));
  const streamed = run(parts);
  expect(streamed.rebuilt).toEqual(whole.rebuilt);
  expect(streamed.calls).toEqual(whole.calls);
  expect(whole.rebuilt.calls).toEqual(whole.calls);
  expect(whole.rebuilt.content).toBe(whole.content ?? "");
  return whole;
}

const hermes: ToolMode = { kind: "auto", parser: "hermes", parallel: true };
const call = (name: string, args: object) => `<tool_call>\n${JSON.stringify({ name, arguments: args })}\n</tool_call>`;

describe("tool-call reader", () => {
  it.each([1, 2, 3, 7, 1000])("hermes blocks become calls, in pieces of %i characters as whole", (size) => {
    const text = `Let me look.\n${call("get_weather", { city: "Paris" })}\n${call("get_time", { tz: "CET" })}`;
    const r = read(hermes, text, size);
    expect(r.calls).toEqual([
      { name: "get_weather", arguments: '{"city":"Paris"}' },
      { name: "get_time", arguments: '{"tz":"CET"}' },
    ]);
    expect(r.content).toBe("Let me look.");
    expect(r.finish).toBe("tool_calls");
  });

  it("hermes: calls only give null content; plain text stays text; a block that is not a call stays text", () => {
    expect(read(hermes, `\n${call("f", {})}\n`, 3)).toMatchObject({ content: null, finish: "tool_calls" });
    expect(read(hermes, "Paris is <b>nice</b>, 3 < 4.\n", 2)).toMatchObject({ content: "Paris is <b>nice</b>, 3 < 4.\n", calls: [], finish: "stop" });
    expect(read(hermes, "<tool_call>not json</tool_call>", 4)).toMatchObject({ content: "<tool_call>not json</tool_call>", calls: [], finish: "stop" });
  });

  it("hermes: an unclosed last block is read at the end; parallel_tool_calls false keeps the first call", () => {
    expect(read(hermes, '<tool_call>{"name": "f", "arguments": {"a": 1}}', 5).calls).toEqual([{ name: "f", arguments: '{"a":1}' }]);
    const one: ToolMode = { kind: "auto", parser: "hermes", parallel: false };
    expect(read(one, `${call("a", {})}${call("b", {})}`, 4).calls.map((c) => c.name)).toEqual(["a"]);
  });

  it("required: the grammar's array becomes calls with the parameters as arguments", () => {
    const text = '[{"name": "get_weather", "parameters": {"city": "Paris", "note": "a } in \\"quotes\\""}}, {"name": "noop", "parameters": {}}]';
    const r = read({ kind: "required", parallel: true }, text, 3);
    expect(r.calls).toEqual([
      { name: "get_weather", arguments: JSON.stringify({ city: "Paris", note: 'a } in "quotes"' }) },
      { name: "noop", arguments: "{}" },
    ]);
    expect([r.content, r.finish]).toEqual([null, "tool_calls"]);
    expect(read({ kind: "required", parallel: true }, '[{"name": "a", "parameters": {"x": [1, 2', 4, "length").finish).toBe("length");
  });

  it("named: the whole text is the arguments, streamed as it comes; finish stays stop", () => {
    const r = read({ kind: "named", name: "get_weather" }, '{"city": "Paris"}', 2);
    expect(r.calls).toEqual([{ name: "get_weather", arguments: '{"city": "Paris"}' }]);
    expect([r.content, r.finish]).toEqual([null, "stop"]);
  });

  it("llama3_json: one object or several separated by ';' become calls; anything else is text", () => {
    const mode: ToolMode = { kind: "auto", parser: "llama3_json", parallel: true };
    const r = read(mode, ' {"name": "a", "parameters": {"x": 1}}; {"name": "b", "arguments": {}}', 3);
    expect(r.calls).toEqual([
      { name: "a", arguments: '{"x":1}' },
      { name: "b", arguments: "{}" },
    ]);
    expect(read(mode, "It is {sunny} today.", 3)).toMatchObject({ content: "It is {sunny} today.", calls: [] });
    expect(read(mode, '{"name": "a"} and more', 3)).toMatchObject({ content: '{"name": "a"} and more', calls: [] });
  });

  it("none: text as it is", () => {
    expect(read({ kind: "none" }, `a ${call("f", {})}`, 3)).toMatchObject({ content: `a ${call("f", {})}`, calls: [], finish: "stop" });
  });
});
