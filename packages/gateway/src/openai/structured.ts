// What a request constrains its output to: OpenAI's response_format (json_object, json_schema,
// structural_tag) or vLLM's structured_outputs (json, regex, choice, grammar, json_object,
// structural_tag), as the grammar spec the workers enforce. Checks their shapes (400 naming the
// field); whether a schema or grammar builds is the grammar checker's question, asked in the
// route. Knows the wire names; nothing of tokens.

import type { GrammarSpec } from "@airm/grammar";
import { ApiError } from "@airm/internal-api";
import { z } from "zod";

/** A constraint and the request field it came from (errors name it). */
export interface Constraint {
  spec: GrammarSpec;
  param: string;
}

const jsonValue = z.union([z.record(z.string(), z.unknown()), z.boolean()]);

const structuralTag = z
  .object({
    type: z.literal("structural_tag"),
    format: z.unknown().optional(),
    structures: z.array(z.object({ begin: z.string(), schema: jsonValue, end: z.string() }).strict()).optional(),
    triggers: z.array(z.string()).optional(),
  })
  .strict();

const responseFormat = z.discriminatedUnion("type", [
  z.object({ type: z.literal("text") }).strict(),
  z.object({ type: z.literal("json_object") }).strict(),
  z
    .object({
      type: z.literal("json_schema"),
      json_schema: z
        .object({
          name: z
            .string()
            .regex(/^[a-zA-Z0-9_-]{1,64}$/, "must be 1-64 letters, digits, underscores or dashes")
            .describe("the schema's name"),
          description: z.string().nullish(),
          schema: jsonValue,
          strict: z.boolean().nullish(),
        })
        .strict(),
    })
    .strict(),
  structuralTag,
]);

const structuredOutputs = z
  .object({
    json: z.union([z.string(), jsonValue]).nullish(),
    regex: z.string().nullish(),
    choice: z.array(z.string()).nullish(),
    grammar: z.string().nullish(),
    json_object: z.boolean().nullish(),
    structural_tag: z.string().nullish(),
    disable_any_whitespace: z.boolean().nullish(),
    disable_additional_properties: z.boolean().nullish(),
    whitespace_pattern: z.string().nullish(),
  })
  .strict();

const RESPONSE_TYPES = ["text", "json_object", "json_schema", "structural_tag"];

function fromZod(err: z.ZodError, root: string, raw: unknown): ApiError {
  const issue = err.issues[0];
  const param = [root, ...issue.path.map(String)].join(".");
  if (issue.code === "invalid_union" && root === "response_format" && (issue.path.length === 0 || (issue.path.length === 1 && issue.path[0] === "type"))) {
    const got = (raw as { type?: unknown } | null)?.type;
    return new ApiError(400, "invalid_request", `response_format.type must be one of ${RESPONSE_TYPES.join(", ")}; got ${JSON.stringify(got ?? null)}`, "response_format.type");
  }
  if (issue.code === "unrecognized_keys") return new ApiError(400, "invalid_request", `${root}: unrecognized key(s) ${issue.keys.map((k) => `'${k}'`).join(", ")}`, root);
  return new ApiError(400, "invalid_request", `invalid '${param}': ${issue.message}`, param);
}

/** A JSON schema's text from a value or a string of JSON. Throws 400 naming `param`. */
function schemaText(v: unknown, param: string): string {
  if (typeof v !== "string") return JSON.stringify(v);
  try {
    return JSON.stringify(JSON.parse(v));
  } catch (e) {
    throw new ApiError(400, "invalid_request", `${param} is not valid JSON: ${(e as Error).message}`, param);
  }
}

/** A structural tag as xgrammar's JSON: the current form as it is, the legacy (structures + triggers) rewritten. */
function structuralTagText(tag: z.infer<typeof structuralTag>, param: string): string {
  if (tag.format !== undefined) {
    if (tag.structures || tag.triggers) throw new ApiError(400, "invalid_request", `${param}: give either format or structures and triggers`, param);
    return JSON.stringify({ type: "structural_tag", format: tag.format });
  }
  if (!tag.structures?.length || !tag.triggers?.length) throw new ApiError(400, "invalid_request", `${param} needs format, or structures and triggers`, param);
  const tags = tag.structures.map((s) => ({ type: "tag", begin: s.begin, content: { type: "json_schema", json_schema: s.schema }, end: s.end }));
  return JSON.stringify({ type: "structural_tag", format: { type: "triggered_tags", triggers: tag.triggers, tags } });
}

function fromResponseFormat(raw: unknown): Constraint | null {
  const r = responseFormat.safeParse(raw);
  if (!r.success) throw fromZod(r.error, "response_format", raw);
  const f = r.data;
  switch (f.type) {
    case "text":
      return null;
    case "json_object":
      return { spec: { type: "json_object" }, param: "response_format" };
    case "json_schema":
      return { spec: { type: "json_schema", schema: JSON.stringify(f.json_schema.schema), anyWhitespace: true }, param: "response_format.json_schema.schema" };
    case "structural_tag":
      return { spec: { type: "structural_tag", tag: structuralTagText(f, "response_format") }, param: "response_format" };
  }
}

function fromStructuredOutputs(raw: unknown): Constraint {
  const r = structuredOutputs.safeParse(raw);
  if (!r.success) throw fromZod(r.error, "structured_outputs", raw);
  const s = r.data;
  const p = "structured_outputs";
  if (s.whitespace_pattern != null) {
    throw new ApiError(
      400,
      "unsupported_parameter",
      `${p}.whitespace_pattern is not supported by this server's grammar engine (xgrammar); use disable_any_whitespace`,
      `${p}.whitespace_pattern`,
    );
  }
  const kinds = (["json", "regex", "choice", "grammar", "json_object", "structural_tag"] as const).filter((k) => s[k] != null && s[k] !== false);
  if (kinds.length !== 1) {
    const what = kinds.length === 0 ? "none is given" : `${kinds.join(", ")} are given`;
    throw new ApiError(400, "invalid_request", `${p} takes exactly one of json, regex, choice, grammar, json_object, structural_tag; ${what}`, p);
  }
  const at = `${p}.${kinds[0]}`;
  if (s.json != null) return { spec: { type: "json_schema", schema: schemaText(s.json, at), anyWhitespace: s.disable_any_whitespace !== true }, param: at };
  if (s.regex != null) {
    if (s.regex.length === 0) throw new ApiError(400, "invalid_request", `${at} must not be empty`, at);
    return { spec: { type: "regex", pattern: s.regex }, param: at };
  }
  if (s.choice != null) {
    if (s.choice.length === 0) throw new ApiError(400, "invalid_request", `${at} must list at least one choice`, at);
    return { spec: { type: "choice", choices: s.choice }, param: at };
  }
  if (s.grammar != null) {
    if (s.grammar.trim().length === 0) throw new ApiError(400, "invalid_request", `${at} must not be empty`, at);
    return { spec: { type: "grammar", ebnf: s.grammar }, param: at };
  }
  if (s.structural_tag != null) return { spec: { type: "structural_tag", tag: schemaText(s.structural_tag, at) }, param: at };
  return { spec: { type: "json_object" }, param: at };
}

/**
 * The request's constraint from `response_format` and `structured_outputs` (at most one of them
 * may constrain), or null. Throws ApiError 400 naming the field.
 */
export function constraintOf(body: { response_format?: unknown; structured_outputs?: unknown }): Constraint | null {
  const fromFormat = body.response_format == null ? null : fromResponseFormat(body.response_format);
  const fromOutputs = body.structured_outputs == null ? null : fromStructuredOutputs(body.structured_outputs);
  if (fromFormat && fromOutputs) {
    throw new ApiError(400, "invalid_request", "response_format and structured_outputs both constrain the output; use one", "structured_outputs");
  }
  return fromFormat ?? fromOutputs;
}
