// @airm/grammar: structured outputs. Specs and their recipes, the checker (no vocabulary) and the
// engine (compiled grammars and matchers) over xgrammar's wasm build, each in a thread of its own.
export { GrammarSpecSchema, grammarKey, recipeOf, ebnfLiteral, type GrammarSpec } from "./grammar-spec.ts";
export { GrammarChecker } from "./grammar-checker.ts";
export { GrammarEngine, GrammarMatcher, type GrammarEngineOptions, type GrammarEngineStats, type VocabInit } from "./grammar-engine.ts";
export { XGRAMMAR_VERSION } from "./grammar-thread-client.ts";
export { prepareJsonSchema, type PreparedSchema } from "./json-schema-prep.ts";
export { numberRangeRules, type NumericBounds } from "./number-range.ts";
