// The grammar engine and checker on a small raw vocabulary (one token per printable character, a
// few longer tokens and an end-of-sequence id): masks allow exactly what the grammar lets come
// next, a replayed matcher stands where the advanced one does (what a decode worker relies on),
// tokens outside the grammar are refused, and bad specs are refused by name without harming the
// threads that serve good ones.
import { afterAll, describe, expect, test } from "vitest";
import { GrammarChecker, GrammarEngine, type GrammarMatcher, type GrammarSpec } from "../src/index.ts";

const EOS = 0;
const CHARS = Array.from({ length: 95 }, (_, i) => String.fromCharCode(32 + i));
const LONG = ['{"', '":', '",', "true", "false", "null", "red", "green", "blue", "\n"];
const VOCAB = ["</s>", ...CHARS, ...LONG];
const id = (t: string) => VOCAB.indexOf(t);

/** Token ids of `text`, one character each. */
const chars = (text: string) => [...text].map((c) => id(c));

const engine = GrammarEngine.start({ tokens: VOCAB, type: "raw", prependSpace: false, vocabSize: VOCAB.length, stopIds: [EOS] });
const checker = new GrammarChecker();
afterAll(async () => {
  await engine.close();
  await checker.close();
});

function allowed(m: GrammarMatcher): string[] {
  const mask = m.allowedTokens();
  if (mask === null) return ["*"];
  return VOCAB.filter((_, i) => (mask[i >> 5] >>> (i & 31)) & 1);
}

/** Feeds `text` (one token per character), checking each token was allowed; returns what may follow. */
function feed(m: GrammarMatcher, text: string): string[] {
  for (const t of chars(text)) {
    expect(allowed(m)).toContain(VOCAB[t]);
    m.advance(t);
  }
  return allowed(m);
}

const schema = (s: object): GrammarSpec => ({ type: "json_schema", schema: JSON.stringify(s), anyWhitespace: false });

describe("grammar engine", () => {
  test("a JSON schema: the mask allows what may come next, then only the end", async () => {
    const m = await engine.matcher(schema({ type: "object", properties: { color: { enum: ["red", "green"] } }, required: ["color"] }), [], "response_format");
    expect(allowed(m)).toEqual(["{", '{"']);
    expect(feed(m, '{"color": "')).toEqual(["g", "r", "green", "red"].sort((a, b) => id(a) - id(b)));
    expect(feed(m, 'red"}')).toEqual(["</s>"]);
    m.close();
  });

  test("a replayed matcher stands where the advanced one does", async () => {
    const spec = schema({ type: "object", properties: { n: { type: "integer", minimum: 10, maximum: 19 }, ok: { type: "boolean" } }, required: ["n", "ok"] });
    const a = await engine.matcher(spec, [], "p");
    feed(a, '{"n": 1');
    const b = await engine.matcher(spec, chars('{"n": 1'), "p");
    expect(allowed(b)).toEqual(allowed(a));
    expect(allowed(a)).toEqual(["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"]);
    expect(b.accepted).toEqual(chars('{"n": 1'));
    a.close();
    b.close();
  });

  test("a token the grammar does not allow is refused, and a replay it does not accept fails the open", async () => {
    const spec: GrammarSpec = { type: "choice", choices: ["yes", "no"] };
    const m = await engine.matcher(spec, [], "p");
    m.advance(id("x"));
    expect(() => m.allowedTokens()).toThrow(/does not accept token/);
    m.close();
    await expect(engine.matcher(spec, chars("nx"), "p")).rejects.toThrow(/does not accept the 2 token/);
  });

  test("choice, regex, EBNF and structural tags", async () => {
    const choice = await engine.matcher({ type: "choice", choices: ['say "hi"', "a\\b"] }, [], "p");
    expect(feed(choice, 'say "hi"')).toEqual(["</s>"]);
    choice.close();
    const regex = await engine.matcher({ type: "regex", pattern: "[0-9]{2}-[a-c]" }, [], "p");
    expect(feed(regex, "42-")).toEqual(["a", "b", "c"]);
    regex.close();
    const ebnf = await engine.matcher({ type: "grammar", ebnf: 'root ::= "(" root ")" | "x"' }, [], "p");
    expect(feed(ebnf, "((x)")).toEqual([")"]);
    ebnf.close();
    const tag = JSON.stringify({ type: "structural_tag", format: { type: "tag", begin: "<a>", content: { type: "const_string", value: "ok" }, end: "</a>" } });
    const st = await engine.matcher({ type: "structural_tag", tag }, [], "p");
    expect(feed(st, "<a>ok</a")).toEqual([">"]);
    st.close();
  });

  test("JSON mode allows an object", async () => {
    const m = await engine.matcher({ type: "json_object" }, [], "p");
    expect(allowed(m)).toContain("{");
    expect(feed(m, '{"a": [1, true]}')).toContain("</s>");
    m.close();
  });

  test("compiled grammars are cached by spec", async () => {
    const spec = schema({ type: "array", items: { type: "string", maxLength: 3 }, maxItems: 2 });
    const before = engine.stats.compiles;
    (await engine.matcher(spec, [], "p")).close();
    (await engine.matcher(spec, [], "p")).close();
    expect(engine.stats.compiles).toBe(before + 1);
    expect(engine.openMatchers).toBe(0);
  });
});

describe("bad specs are refused by name, and the threads keep serving", () => {
  const bad: Array<[string, GrammarSpec, RegExp]> = [
    ["an unknown type", schema({ type: "nonsense" }), /Unsupported type "nonsense"/],
    ["a $ref to nothing", schema({ $ref: "#/$defs/x" }), /Cannot find field \$defs/],
    ["a bad pattern", schema({ type: "string", pattern: "(ab" }), /parenthesis is not closed/],
    ["a schema that is not JSON", { type: "json_schema", schema: "{nope", anyWhitespace: true }, /not valid JSON/],
    ["multipleOf", schema({ type: "integer", multipleOf: 5 }), /at \/multipleOf: 'multipleOf' is not enforced/],
    ["uniqueItems", schema({ type: "array", items: { type: "integer" }, uniqueItems: true }), /at \/uniqueItems/],
    ["if/then", schema(JSON.parse('{"type": "object", "properties": {"a": {"if": {"const": 1}, "then": {"const": 1}}}}')), /at \/properties\/a\/if: 'if\/then\/else'/],
    ["an empty range", schema({ type: "integer", minimum: 5, maximum: 1 }), /no integer lies between/],
    ["bounds without a numeric type", schema({ type: "string", minimum: 1 }), /need 'type' integer or number/],
    ["a bad regex", { type: "regex", pattern: "(ab" }, /parenthesis is not closed/],
    ["a bad grammar", { type: "grammar", ebnf: "root ::= foo" }, /Rule "foo" is not defined/],
  ];
  test.each(bad)("%s", async (_, spec, reason) => {
    const err = checker.check(spec, "response_format");
    await expect(err).rejects.toThrow(reason);
    await expect(err).rejects.toMatchObject({ invalid: true, param: "response_format" });
    await expect(engine.matcher(spec, [], "response_format")).rejects.toMatchObject({ invalid: true });
    // The same threads answer a good spec afterwards.
    await expect(checker.check({ type: "choice", choices: ["a"] }, "p")).resolves.toBeUndefined();
    const m = await engine.matcher({ type: "choice", choices: ["ab"] }, [], "p");
    expect(allowed(m)).toEqual(["a"]);
    m.close();
  });

  test("the checker replaced its thread after each abort (the rest were refused before xgrammar saw them)", async () => {
    expect(checker.counts.aborted).toBe(5);
    await checker.check({ type: "regex", pattern: "[a-z]+" }, "p");
    // Each aborted thread was replaced by the next check that needed one (remembered specs need none).
    expect(checker.counts.threads).toBe(checker.counts.aborted + 1);
  });
});
