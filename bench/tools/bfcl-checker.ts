// The Berkeley Function Calling Leaderboard's AST checker (bfcl-eval 2026.3.23,
// eval_checker/ast_eval/ast_checker.py, Python language only) and its function-calling decoder
// (the OpenAI handler's decode_ast, the runner's relevance rule), re-implemented on a model of
// Python's JSON values: json.loads keeps ints apart from floats, and `==` / `in` compare numbers
// across int, float and bool (1 == 1.0 == True). Knows the scoring rules; nothing of HTTP.

/** A value as Python's json.loads makes it. */
export type Py =
  | { t: "none" }
  | { t: "bool"; v: boolean }
  | { t: "int"; v: number }
  | { t: "float"; v: number }
  | { t: "str"; v: string }
  | { t: "list"; v: Py[] }
  | { t: "dict"; v: Map<string, Py> };

/** Python's type name of a value (what `type(x)` compares). */
export type PyType = Py["t"];

/** JSON text read as Python reads it; throws SyntaxError as json.loads would. */
export function loadsPy(text: string): Py {
  // The reviver's source text tells 5 from 5.0 (JSON.parse would give 5 for both).
  const tagged = JSON.parse(text, (_k, v: unknown, ctx?: { source?: string }) => (typeof v === "number" ? { __num: v, __float: /[.eE]/.test(ctx?.source ?? "") } : v));
  return toPy(tagged);
}

/** A plain JSON value (from JSON.parse) as Python values: an integral number is an int. */
export function toPy(v: unknown): Py {
  if (v === null) return { t: "none" };
  if (typeof v === "boolean") return { t: "bool", v };
  if (typeof v === "number") return Number.isInteger(v) ? { t: "int", v } : { t: "float", v };
  if (typeof v === "string") return { t: "str", v };
  if (Array.isArray(v)) return { t: "list", v: v.map(toPy) };
  const o = v as Record<string, unknown>;
  if (typeof o.__num === "number" && typeof o.__float === "boolean" && Object.keys(o).length === 2) return { t: o.__float ? "float" : "int", v: o.__num };
  return { t: "dict", v: new Map(Object.entries(o).map(([k, x]) => [k, toPy(x)])) };
}

/** A Python value back as plain JSON (ints and floats alike as numbers). */
export function plain(x: Py): unknown {
  switch (x.t) {
    case "none":
      return null;
    case "list":
      return x.v.map(plain);
    case "dict":
      return Object.fromEntries([...x.v].map(([k, y]) => [k, plain(y)]));
    default:
      return x.v;
  }
}

/** A Python-ish repr, for error messages and reports. */
export function repr(x: Py): string {
  switch (x.t) {
    case "none":
      return "None";
    case "bool":
      return x.v ? "True" : "False";
    case "int":
      return String(x.v);
    case "float":
      return Number.isInteger(x.v) ? `${x.v}.0` : String(x.v);
    case "str":
      return `'${x.v}'`;
    case "list":
      return `[${x.v.map(repr).join(", ")}]`;
    case "dict":
      return `{${[...x.v].map(([k, y]) => `'${k}': ${repr(y)}`).join(", ")}}`;
  }
}

const numeric = (x: Py): number | null => (x.t === "int" || x.t === "float" ? x.v : x.t === "bool" ? Number(x.v) : null);

/** Python's `a == b` on JSON values. */
export function pyEq(a: Py, b: Py): boolean {
  const na = numeric(a);
  const nb = numeric(b);
  if (na !== null || nb !== null) return na !== null && nb !== null && na === nb;
  if (a.t !== b.t) return false;
  switch (a.t) {
    case "none":
      return true;
    case "str":
      return a.v === (b as { v: string }).v;
    case "list": {
      const bv = (b as { v: Py[] }).v;
      return a.v.length === bv.length && a.v.every((x, i) => pyEq(x, bv[i]));
    }
    case "dict": {
      const bv = (b as { v: Map<string, Py> }).v;
      return a.v.size === bv.size && [...a.v].every(([k, x]) => bv.has(k) && pyEq(x, bv.get(k)!));
    }
    default:
      return false;
  }
}

/** Python's `x in xs` for a list. */
const pyIn = (x: Py, xs: Py[]): boolean => xs.some((y) => pyEq(x, y));
const str = (v: string): Py => ({ t: "str", v });
const isEmptyStr = (x: Py) => x.t === "str" && x.v === "";

/** The checker's type names and the Python types they stand for. */
const PYTHON_TYPE_MAPPING: Record<string, PyType> = { string: "str", integer: "int", float: "float", boolean: "bool", array: "list", tuple: "list", dict: "dict", any: "str" };
const PYTHON_NESTED_TYPE_CHECK_LIST = ["array", "tuple"];

/** A BFCL function description (the dataset's, types as BFCL writes them: dict, float, tuple, any). */
export interface FunctionDoc {
  name: string;
  description?: string;
  parameters: { type: string; properties: Record<string, { type: string; items?: { type: string }; [k: string]: unknown }>; required: string[] };
}

/** One decoded call: {function name: {param: value}}. */
export type DecodedCall = { name: string; params: Map<string, Py> };

export interface CheckResult {
  valid: boolean;
  error: string[];
  errorType?: string;
}

const fail = (errorType: string, ...error: string[]): CheckResult => ({ valid: false, error, errorType });
const ok = (): CheckResult => ({ valid: true, error: [] });

/**
 * standardize_string: drops spaces and `,./-_*^`, lowercases, and turns single quotes into double
 * ones (April 1, 2024 = April 1 2024).
 */
export function standardizeString(s: string): string {
  return s
    .replace(/[ ,./\-_*^]/g, "")
    .toLowerCase()
    .replaceAll("'", '"');
}

/** The type of the first possible answer that is not "" (the optional marker), or null. */
function possibleAnswerType(possible: Py[]): PyType | null {
  for (const a of possible) if (!isEmptyStr(a)) return a.t;
  return null;
}

interface TypeCheck extends CheckResult {
  isVariable: boolean;
}

function typeChecker(param: string, value: Py, possible: Py[], desc: string, expected: PyType, nested: PyType | null): TypeCheck {
  const paType = possibleAnswerType(possible);
  const isVariable = paType !== null && paType !== expected;
  if (value.t === expected) {
    if (nested === null) return { valid: true, error: [], isVariable };
    for (const item of possible) {
      let flag = true;
      if (item.t === "list") {
        for (const v of (value as { v: Py[] }).v) {
          if (!typeChecker(param, v, item.v, nested, nested, null).valid) {
            flag = false;
            break;
          }
        }
      }
      if (flag) return { valid: true, error: [], isVariable };
    }
    // BFCL falls through here with valid false: the answer is invalid either way
    return {
      valid: false,
      error: [`Nested type checking failed for parameter '${param}'. Expected outer type ${desc} with inner type ${nested}. Parameter value: ${repr(value)}.`],
      errorType: "type_error:nested",
      isVariable: false,
    };
  }
  if (paType !== null && value.t === paType) return { valid: true, error: [], isVariable: true };
  return {
    valid: false,
    error: [`Incorrect type for parameter '${param}'. Expected type ${desc}, got ${value.t}. Parameter value: ${repr(value)}.`],
    errorType: "type_error:simple",
    isVariable: false,
  };
}

function stringChecker(param: string, value: string, possible: Py[]): CheckResult {
  const want = possible.filter((p) => p.t === "str").map((p) => standardizeString((p as { v: string }).v));
  if (!want.includes(standardizeString(value)))
    return fail("value_error:string", `Invalid value for parameter '${param}': '${value}'. Expected one of ${repr({ t: "list", v: possible })}. Case insensitive.`);
  return ok();
}

/** A list's items with strings standardised (a "" answer reads as an empty list, as BFCL's loop over its characters makes it). */
function standardizeList(x: Py): Py {
  const items = x.t === "list" ? x.v : x.t === "str" ? [...x.v].map(str) : [];
  return { t: "list", v: items.map((i) => (i.t === "str" ? str(standardizeString(i.v)) : i)) };
}

function listChecker(param: string, value: Py[], possible: Py[]): CheckResult {
  const got = standardizeList({ t: "list", v: value });
  if (!possible.some((p) => pyEq(got, standardizeList(p))))
    return fail("value_error:list/tuple", `Invalid value for parameter '${param}': ${repr({ t: "list", v: value })}. Expected one of ${repr({ t: "list", v: possible })}.`);
  return ok();
}

function dictChecker(_param: string, value: Map<string, Py>, possibleAnswers: Py[]): CheckResult {
  let result = fail("dict_checker:unclear");
  for (const answer of possibleAnswers) {
    if (isEmptyStr(answer)) continue;
    if (answer.t !== "dict") continue;
    result = fail("dict_checker:unclear");
    let flag = true;
    for (const [key, v] of value) {
      const options = answer.v.get(key);
      if (options === undefined) {
        result = fail("value_error:dict_key", `Unexpected dict key parameter: '${key}'.`);
        flag = false;
        break;
      }
      const std = v.t === "str" ? str(standardizeString(v.v)) : v;
      const stdOptions = (options.t === "list" ? options.v : []).map((o) => (o.t === "str" ? str(standardizeString(o.v)) : o));
      if (!pyIn(std, stdOptions)) {
        result = fail("value_error:dict_value", `Invalid value for parameter '${key}': ${repr(v)}. Expected one of ${repr({ t: "list", v: stdOptions })}.`);
        flag = false;
        break;
      }
    }
    if (flag) {
      for (const [key, options] of answer.v) {
        if (!value.has(key) && !(options.t === "list" && options.v.some(isEmptyStr))) {
          result = fail("value_error:dict_key", `Missing dict key parameter: '${key}'.`);
          flag = false;
          break;
        }
      }
    }
    if (flag) return ok();
  }
  return result;
}

function listDictChecker(param: string, value: Py[], possibleAnswers: Py[]): CheckResult {
  let result = fail("list_dict_checker:unclear");
  for (const answer of possibleAnswers) {
    const items = answer.t === "list" ? answer.v : answer.t === "str" ? [...answer.v].map(str) : [];
    if (value.length !== items.length) {
      result = fail("value_error:list_dict_count", "Wrong number of dictionaries in the list.");
      continue;
    }
    let flag = true;
    for (let i = 0; i < value.length; i++) {
      const v = value[i];
      result = v.t === "dict" ? dictChecker(param, v.v, [items[i]]) : fail("value_error:dict_value", `Not a dictionary: ${repr(v)}.`);
      if (!result.valid) {
        flag = false;
        break;
      }
    }
    if (flag) return ok();
  }
  return result;
}

/** The name a function is called by over OpenAI's API (dots are not allowed there: BFCL's underscore_to_dot models). */
export function openAiName(name: string): string {
  return name.replaceAll(".", "_");
}

/** simple_function_checker: one call against one function's possible answer {name: {param: [values]}}. */
export function simpleFunctionChecker(doc: FunctionDoc, call: DecodedCall, possibleAnswer: Map<string, Py>): CheckResult {
  const possible = [...possibleAnswer.values()][0];
  if (possible?.t !== "dict") return fail("simple_function_checker:unclear", "The possible answer is not a dictionary.");
  const answers = possible.v;
  const props = doc.parameters.properties;
  const name = openAiName(doc.name);
  if (call.name !== name) return fail("simple_function_checker:wrong_func_name", `Function name '${name}' not found in model output.`);
  const params = call.params;
  for (const p of doc.parameters.required) if (!params.has(p)) return fail("simple_function_checker:missing_required", `Missing required parameter: '${p}'.`);
  for (const [param, raw] of params) {
    if (!(param in props) || !answers.has(param)) return fail("simple_function_checker:unexpected_param", `Unexpected parameter: '${param}'.`);
    const desc = props[param].type;
    const expected = PYTHON_TYPE_MAPPING[desc];
    if (!expected) return fail("simple_function_checker:unknown_type", `Unknown parameter type ${desc} of '${param}'.`);
    let nested: PyType | null = null;
    if (PYTHON_NESTED_TYPE_CHECK_LIST.includes(desc)) {
      nested = PYTHON_TYPE_MAPPING[props[param].items?.type ?? ""] ?? null;
      if (!nested) return fail("simple_function_checker:unknown_type", `Unknown item type of '${param}'.`);
    }
    // Python converts an int to a float where a float is expected (bool stays bool)
    const value: Py = desc === "float" && raw.t === "int" ? { t: "float", v: raw.v } : raw;
    const optionsPy = answers.get(param)!;
    const options = optionsPy.t === "list" ? optionsPy.v : [];
    const typed = typeChecker(param, value, options, desc, expected, nested);
    if (!typed.valid) return typed;
    if (!typed.isVariable) {
      let r: CheckResult | null = null;
      if (expected === "dict") r = dictChecker(param, (value as { v: Map<string, Py> }).v, options);
      else if (expected === "list" && nested === "dict") r = listDictChecker(param, (value as { v: Py[] }).v, options);
      else if (expected === "str") r = stringChecker(param, (value as { v: string }).v, options);
      else if (expected === "list") r = listChecker(param, (value as { v: Py[] }).v, options);
      if (r) {
        if (!r.valid) return r;
        continue;
      }
    }
    if (!pyIn(value, options)) return fail("value_error:others", `Invalid value for parameter '${param}': ${repr(value)}. Expected one of ${repr(optionsPy)}.`);
  }
  for (const [param, options] of answers) {
    if (!params.has(param) && !(options.t === "list" && options.v.some(isEmptyStr)))
      return fail("simple_function_checker:missing_optional", `Optional parameter '${param}' not provided and not marked as optional.`);
  }
  return ok();
}

const findDescription = (docs: FunctionDoc[], name: string) => docs.find((d) => d.name === name);
/** A ground-truth entry {name: {...}} as a one-key map. */
const answerOf = (a: Py): Map<string, Py> => (a.t === "dict" ? a.v : new Map());
const answerName = (a: Py): string => [...answerOf(a).keys()][0] ?? "";

function parallelNoOrder(docs: FunctionDoc[], calls: DecodedCall[], answers: Py[]): CheckResult {
  if (calls.length !== answers.length) return fail("parallel_function_checker_no_order:wrong_count", "Wrong number of functions.");
  const matched = new Set<number>();
  for (let i = 0; i < answers.length; i++) {
    const doc = findDescription(docs, answerName(answers[i]));
    if (!doc) return fail("parallel_function_checker_no_order:cannot_find_match", `No description of ${answerName(answers[i])}.`);
    const errors: string[] = [];
    let found = false;
    for (let j = 0; j < calls.length; j++) {
      if (matched.has(j)) continue;
      const r = simpleFunctionChecker(doc, calls[j], answerOf(answers[i]));
      if (r.valid) {
        matched.add(j);
        found = true;
        break;
      }
      errors.push(`model call ${j}: ${r.error.join(" ")}`);
    }
    if (!found) return fail("parallel_function_checker_no_order:cannot_find_match", `Could not find a matching function for index ${i} of possible answers.`, ...errors);
  }
  return ok();
}

/**
 * ast_checker for the Python categories: parallel* match every answer in any order (greedy, as
 * BFCL), multiple checks the one call against the one answer, simple wants exactly one call.
 * `answers` is the ground truth list [{name: {param: [values]}}, ...].
 */
export function astChecker(category: string, docs: FunctionDoc[], calls: DecodedCall[], answers: Py[]): CheckResult {
  if (category.includes("parallel")) return parallelNoOrder(docs, calls, answers);
  if (category.includes("multiple")) {
    if (calls.length !== answers.length) return fail("multiple_function_checker:wrong_count", "Wrong number of functions.");
    const doc = findDescription(docs, answerName(answers[0]));
    if (!doc) return fail("multiple_function_checker:unclear", `No description of ${answerName(answers[0])}.`);
    return simpleFunctionChecker(doc, calls[0], answerOf(answers[0]));
  }
  if (calls.length !== 1) return fail("simple_function_checker:wrong_count", "Wrong number of functions.");
  return simpleFunctionChecker(docs[0], calls[0], answerOf(answers[0]));
}

/** What the server answered: its tool calls (name and the arguments' text), else its content. */
export interface ModelAnswer {
  toolCalls: { name: string; arguments: string }[] | null;
  content: string | null;
}

/**
 * The OpenAI handler's decode_ast: each call's arguments through json.loads; throws when they do
 * not parse, or when the answer has no tool calls (BFCL then iterates the content string and
 * fails; an empty or missing content decodes to no calls). The result must also be BFCL's
 * function-calling format (each call's arguments a dict), else it throws.
 */
export function decodeAnswer(a: ModelAnswer): DecodedCall[] {
  if (!a.toolCalls || a.toolCalls.length === 0) {
    if (a.content) throw new Error("no tool calls: the answer is text");
    return [];
  }
  return a.toolCalls.map((c) => {
    const params = loadsPy(c.arguments);
    if (params.t !== "dict") throw new Error(`the arguments of ${c.name} are not an object: ${c.arguments}`);
    return { name: c.name, params: params.v };
  });
}

/** Scores one answer as BFCL does: irrelevance passes when nothing decodes to a call, the rest by the AST checker. */
export function scoreAnswer(category: string, docs: FunctionDoc[], answer: ModelAnswer, groundTruth: Py[] | null): CheckResult {
  let calls: DecodedCall[];
  try {
    calls = decodeAnswer(answer);
  } catch (e) {
    if (category.includes("irrelevance")) return ok();
    return fail("ast_decoder:decoder_failed", `Invalid syntax. Failed to decode AST. ${(e as Error).message}`);
  }
  if (category.includes("irrelevance")) return calls.length === 0 ? ok() : fail("irrelevance_error:decoder_success", "Valid syntax. Successfully decode AST when it should not.");
  if (!groundTruth) return fail("no_ground_truth", "No possible answer for this case.");
  return astChecker(category, docs, calls, groundTruth);
}
