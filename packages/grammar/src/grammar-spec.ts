// What a request constrains its output to, as it crosses from the gateway to the workers (a typed
// schema, never the client's free-form body), its cache key, and the recipe a grammar thread
// builds from it. Knows the spec kinds and how each maps onto xgrammar's inputs.

import { GrammarError } from "@airm/rm-core";
import { z } from "zod";
import type { Recipe } from "./grammar-thread.ts";
import { prepareJsonSchema } from "./json-schema-prep.ts";

export const GrammarSpecSchema = z.discriminatedUnion("type", [
  z
    .object({ type: z.literal("json_object") })
    .strict()
    .describe("any JSON object (OpenAI's JSON mode)"),
  z
    .object({
      type: z.literal("json_schema"),
      schema: z.string().min(1).describe("the JSON schema, as JSON text"),
      anyWhitespace: z.boolean().default(true).describe("any whitespace between tokens (false: one line, `, ` and `: `)"),
    })
    .strict(),
  z.object({ type: z.literal("regex"), pattern: z.string().min(1) }).strict(),
  z.object({ type: z.literal("choice"), choices: z.array(z.string()).min(1).describe("the output is exactly one of these") }).strict(),
  z.object({ type: z.literal("grammar"), ebnf: z.string().min(1).describe("an EBNF grammar whose root rule is `root`") }).strict(),
  z.object({ type: z.literal("structural_tag"), tag: z.string().min(1).describe("an xgrammar structural tag, as JSON text") }).strict(),
]);
export type GrammarSpec = z.output<typeof GrammarSpecSchema>;

/** A stable key of a spec (compiled grammars are cached by it, with the vocabulary). */
export function grammarKey(spec: GrammarSpec): string {
  switch (spec.type) {
    case "json_object":
      return "json_object";
    case "json_schema":
      return `json_schema:${spec.anyWhitespace ? "any" : "compact"}:${spec.schema}`;
    case "regex":
      return `regex:${spec.pattern}`;
    case "choice":
      return `choice:${JSON.stringify(spec.choices)}`;
    case "grammar":
      return `grammar:${spec.ebnf}`;
    case "structural_tag":
      return `structural_tag:${spec.tag}`;
  }
}

/** An EBNF string literal of `s` (C-style escapes for quotes, backslashes and control characters). */
export function ebnfLiteral(s: string): string {
  let out = '"';
  for (const ch of s) {
    const c = ch.codePointAt(0)!;
    if (ch === '"' || ch === "\\") out += `\\${ch}`;
    else if (ch === "\n") out += "\\n";
    else if (ch === "\r") out += "\\r";
    else if (ch === "\t") out += "\\t";
    else if (c < 0x20 || c === 0x7f) out += `\\x${c.toString(16).padStart(2, "0")}`;
    else out += ch;
  }
  return `${out}"`;
}

function parseJson(text: string, param: string, what: string): unknown {
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new GrammarError(`${param}: ${what} is not valid JSON: ${(e as Error).message}`, { param, invalid: true });
  }
}

/**
 * What a grammar thread builds for `spec`. `param` names the request field in errors. Throws
 * GrammarError (invalid) for what is refused before xgrammar sees it (see json-schema-prep.ts).
 */
export function recipeOf(spec: GrammarSpec, param: string): Recipe {
  switch (spec.type) {
    case "json_object":
      // An object (OpenAI's JSON mode answers with one), any members: xgrammar's JSON grammar also allows an array.
      return { kind: "json_schema", schema: '{"type":"object","additionalProperties":true}', anyWhitespace: true, splices: [] };
    case "json_schema": {
      const prepared = prepareJsonSchema(parseJson(spec.schema, param, "the schema"), param);
      return { kind: "json_schema", schema: prepared.schema, anyWhitespace: spec.anyWhitespace, splices: prepared.splices };
    }
    case "regex":
      return { kind: "structural_tag", json: JSON.stringify({ type: "structural_tag", format: { type: "regex", pattern: spec.pattern } }) };
    case "choice":
      return { kind: "ebnf", ebnf: `root ::= ${spec.choices.map(ebnfLiteral).join(" | ")}\n` };
    case "grammar":
      return { kind: "ebnf", ebnf: spec.ebnf };
    case "structural_tag":
      parseJson(spec.tag, param, "the structural tag");
      return { kind: "structural_tag", json: spec.tag };
  }
}
