// The tools bench's scoring (bench/tools/): BFCL's AST checker rules as bfcl-eval 2026.3.23 states
// them (int accepted for float, not float for int; strings compared without case, spaces and
// ,./-_*^; optional parameters; parallel calls in any order; irrelevance passes without a call),
// BFCL's OpenAI tool conversion, and the answer shapes the report names.
import { describe, expect, test } from "vitest";
import { answerShape, textCalls } from "../bench/tools/answer-shape.ts";
import { type FunctionDoc, loadsPy, type Py, scoreAnswer, toPy } from "../bench/tools/bfcl-checker.ts";
import { toOpenAiTools } from "../bench/tools/bfcl-data.ts";

const area: FunctionDoc = {
  name: "geometry.area",
  parameters: {
    type: "dict",
    properties: {
      base: { type: "integer" },
      height: { type: "float" },
      unit: { type: "string" },
      exact: { type: "boolean" },
      sides: { type: "array", items: { type: "integer" } },
      opts: { type: "dict", properties: { a: { type: "string" } } },
    },
    required: ["base", "height"],
  },
};
const time: FunctionDoc = { name: "get_time", parameters: { type: "dict", properties: { zone: { type: "string" } }, required: ["zone"] } };
/** The ground truth as BFCL's JSON writes it (5.0 stays a float). */
const truth = (json: string): Py[] => (loadsPy(json) as { v: Py[] }).v;
const areaTruth = truth(
  '[{"geometry.area": {"base": [10], "height": [5.0], "unit": ["April 1, 2024", ""], "exact": ["", true], "sides": ["", [3, 4]], "opts": ["", {"a": ["x"]}]}}]',
);
const call = (name: string, args: string) => ({ toolCalls: [{ name, arguments: args }], content: null });
const simple = (args: string) => scoreAnswer("simple_python", [area], call("geometry_area", args), areaTruth);

describe("BFCL's AST checker rules", () => {
  test("the called name is the dotted name with underscores; values among the possible answers", () => {
    expect(simple('{"base": 10, "height": 5.0}').valid).toBe(true);
    expect(scoreAnswer("simple_python", [area], call("geometry.area", '{"base": 10, "height": 5.0}'), areaTruth).errorType).toBe("simple_function_checker:wrong_func_name");
    expect(simple('{"base": 11, "height": 5.0}').errorType).toBe("value_error:others");
  });

  test("an int is accepted for a float, a float or a bool not for an int", () => {
    expect(simple('{"base": 10, "height": 5}').valid).toBe(true);
    expect(simple('{"base": 10.0, "height": 5.0}').errorType).toBe("type_error:simple");
    expect(simple('{"base": true, "height": 5.0}').errorType).toBe("type_error:simple");
    expect(simple('{"base": 10, "height": 5.0, "exact": 1}').errorType).toBe("type_error:simple");
  });

  test("strings compare without case, spaces and ,./-_*^ (in lists and dicts too)", () => {
    expect(simple('{"base": 10, "height": 5, "unit": "april 1 2024"}').valid).toBe(true);
    expect(simple('{"base": 10, "height": 5, "unit": "April 2, 2024"}').errorType).toBe("value_error:string");
    expect(simple('{"base": 10, "height": 5, "sides": [3, 4]}').valid).toBe(true);
    expect(simple('{"base": 10, "height": 5, "sides": [4, 3]}').errorType).toBe("value_error:list/tuple");
    // BFCL's nested type check passes on a "" (optional) answer, so the value check is what fails here
    expect(simple('{"base": 10, "height": 5, "sides": ["3", "4"]}').errorType).toBe("value_error:list/tuple");
    const listed = truth('[{"geometry.area": {"base": [10], "height": [5.0], "sides": [[3, 4]]}}]');
    expect(scoreAnswer("simple_python", [area], call("geometry_area", '{"base": 10, "height": 5, "sides": ["3", "4"]}'), listed).errorType).toBe("type_error:nested");
    expect(simple('{"base": 10, "height": 5, "opts": {"a": "X"}}').valid).toBe(true);
    expect(simple('{"base": 10, "height": 5, "opts": {"b": "x"}}').errorType).toBe("value_error:dict_key");
  });

  test("required present, optional absent only where the answers allow it, no unknown parameter", () => {
    expect(simple('{"base": 10}').errorType).toBe("simple_function_checker:missing_required");
    expect(simple('{"base": 10, "height": 5, "colour": "red"}').errorType).toBe("simple_function_checker:unexpected_param");
    const strict = truth('[{"geometry.area": {"base": [10], "height": [5.0], "unit": ["cm"]}}]');
    expect(scoreAnswer("simple_python", [area], call("geometry_area", '{"base": 10, "height": 5}'), strict).errorType).toBe("simple_function_checker:missing_optional");
  });

  test("parallel calls match in any order and in number; simple wants one call", () => {
    const two = truth('[{"get_time": {"zone": ["CET"]}}, {"get_time": {"zone": ["UTC"]}}]');
    const calls = (zones: string[]) => ({ toolCalls: zones.map((z) => ({ name: "get_time", arguments: JSON.stringify({ zone: z }) })), content: null });
    expect(scoreAnswer("parallel", [time], calls(["utc", "CET"]), two).valid).toBe(true);
    expect(scoreAnswer("parallel", [time], calls(["CET"]), two).errorType).toBe("parallel_function_checker_no_order:wrong_count");
    expect(scoreAnswer("parallel", [time], calls(["CET", "CET"]), two).valid).toBe(false);
    expect(scoreAnswer("simple_python", [time], calls(["CET", "UTC"]), truth('[{"get_time": {"zone": ["CET"]}}]')).errorType).toBe("simple_function_checker:wrong_count");
  });

  test("text or unparsable arguments are no call: a pass for irrelevance, a fail elsewhere", () => {
    const text = { toolCalls: null, content: "I cannot help with that." };
    expect(scoreAnswer("irrelevance", [time], text, null).valid).toBe(true);
    expect(scoreAnswer("irrelevance", [time], call("get_time", '{"zone": "CET"}'), null).valid).toBe(false);
    expect(scoreAnswer("irrelevance", [time], call("get_time", "{zone: CET"), null).valid).toBe(true);
    expect(scoreAnswer("simple_python", [area], text, areaTruth).errorType).toBe("ast_decoder:decoder_failed");
  });

  test("json.loads keeps 5 and 5.0 apart; == does not", () => {
    expect(loadsPy("[5, 5.0, 5e0, true]")).toEqual(toPy([5, { __num: 5, __float: true }, { __num: 5, __float: true }, true]));
  });
});

test("BFCL's OpenAI tools: dict -> object, float -> number (said so), tuple -> array, any -> string, dots -> underscores", () => {
  const [t] = toOpenAiTools([
    {
      name: "a.b",
      description: "d",
      parameters: {
        type: "dict",
        properties: {
          x: { type: "float", description: "x." },
          p: { type: "tuple", items: { type: "float" } },
          q: { type: "any" },
          r: { type: "dict", properties: { s: { type: "integer" } } },
        },
        required: ["x"],
      },
    },
  ]);
  expect(t).toEqual({
    type: "function",
    function: {
      name: "a_b",
      description: "d",
      parameters: {
        type: "object",
        properties: {
          x: { type: "number", format: "float", description: "x. This is a float type value." },
          p: { type: "array", items: { type: "number" } },
          q: { type: "string" },
          r: { type: "object", properties: { s: { type: "integer" } } },
        },
        required: ["x"],
      },
    },
  });
});

test("answer shapes: parsed calls, a call written as JSON (bare or fenced), text", () => {
  const a = (content: string | null, toolCalls: { name: string; arguments: string }[] | null = null) => answerShape({ ok: true, content, toolCalls });
  expect(a(null, [{ name: "f", arguments: "{}" }])).toBe("tool_calls");
  expect(a('{"name": "f", "arguments": {"x": 1}}')).toBe("text: JSON call");
  expect(a('```json\n{"name": "f", "arguments": {"x": 1}}\n```')).toBe("text: ```json call");
  expect(a('Here: {"name": "f", "arguments": {}}')).toBe("text");
  expect(textCalls('{"name": "f", "arguments": {"x": 1}}\n{"name": "g", "parameters": {}}')).toEqual([
    { name: "f", arguments: '{"x":1}' },
    { name: "g", arguments: "{}" },
  ]);
});
