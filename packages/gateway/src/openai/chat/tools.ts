// Tool calling on /v1/chat/completions, as vLLM serves it: `tools` checked and handed to the chat
// template, `tool_choice` none / auto / required / named, `parallel_tool_calls`. required and named
// become a grammar (named: that function's parameters; required: a non-empty JSON array of
// {name, parameters}, vLLM's schema); auto leaves the text free and a tool-call parser reads it
// (tool-calls.ts). Knows OpenAI's tool shapes; nothing of tokens.

import type { ChatTool } from "@airm/internal-api";
import { ApiError } from "@airm/internal-api";
import { z } from "zod";
import type { Constraint } from "../structured.ts";

/** The tool-call parsers of `auto` (vLLM's --tool-call-parser names). */
export const TOOL_CALL_PARSERS = ["hermes", "llama3_json"] as const;
export type ToolCallParserName = (typeof TOOL_CALL_PARSERS)[number];

/** How the answer's tool calls come about. */
export type ToolMode =
  | { kind: "none" }
  | { kind: "auto"; parser: ToolCallParserName; parallel: boolean }
  | { kind: "required"; parallel: boolean }
  | { kind: "named"; name: string };

/** The server's tool settings (vLLM's --enable-auto-tool-choice and --tool-call-parser). */
export interface ToolSettings {
  /** The parser of `auto` answers; null: `auto` is refused. */
  parser: ToolCallParserName | null;
}

const toolSchema = z
  .object({
    type: z.literal("function"),
    function: z
      .object({
        name: z.string().regex(/^[a-zA-Z0-9_-]{1,64}$/, "must be 1-64 letters, digits, underscores or dashes"),
        description: z.string().nullish(),
        parameters: z.record(z.string(), z.unknown()).nullish(),
        strict: z.boolean().nullish(),
      })
      .strict(),
  })
  .strict();

const toolChoiceSchema = z.union([z.enum(["none", "auto", "required"]), z.object({ type: z.literal("function"), function: z.object({ name: z.string() }).strict() }).strict()]);

/** `tools.0.function.name` as OpenAI writes it: `tools[0].function.name`. */
function paramOf(root: string, path: PropertyKey[]): string {
  return path.reduce<string>((p, k) => (typeof k === "number" ? `${p}[${k}]` : `${p}.${String(k)}`), root);
}

function invalid(root: string, err: z.ZodError): ApiError {
  const issue = err.issues[0];
  const param = paramOf(root, issue.path);
  const message = issue.code === "invalid_type" && issue.input === undefined ? `'${param}' is a required property` : `invalid '${param}': ${issue.message}`;
  return new ApiError(400, "invalid_request", message, param);
}

/** The tools as the internal API carries them. Throws 400 naming the tool's field. */
function parseTools(raw: unknown): ChatTool[] {
  const r = z.array(toolSchema).min(1, "must list at least one tool").safeParse(raw);
  if (!r.success) throw invalid("tools", r.error);
  const seen = new Set<string>();
  return r.data.map((t, i) => {
    const f = t.function;
    if (seen.has(f.name)) throw new ApiError(400, "invalid_request", `tools[${i}].function.name '${f.name}' is given twice`, `tools[${i}].function.name`);
    seen.add(f.name);
    const parameters = f.parameters ?? { type: "object", properties: {} };
    if (parameters.type !== undefined && parameters.type !== "object") {
      throw new ApiError(
        400,
        "invalid_request",
        `tools[${i}].function.parameters must be a JSON schema of an object (type "object"), got type ${JSON.stringify(parameters.type)}`,
        `tools[${i}].function.parameters`,
      );
    }
    return { name: f.name, ...(f.description ? { description: f.description } : {}), parameters };
  });
}

/** vLLM's schema of `required`: a non-empty array of {name, parameters}, one branch per tool, their $defs merged. */
export function requiredToolsSchema(tools: ChatTool[], parallel: boolean): Record<string, unknown> {
  const defs: Record<string, unknown> = {};
  const branches = tools.map((t) => {
    const { $defs, ...params } = t.parameters as { $defs?: Record<string, unknown> };
    for (const [k, v] of Object.entries($defs ?? {})) {
      if (k in defs && JSON.stringify(defs[k]) !== JSON.stringify(v)) {
        throw new ApiError(400, "invalid_request", `tools define $defs '${k}' twice, differently; give the definitions distinct names`, "tools");
      }
      defs[k] = v;
    }
    return { properties: { name: { type: "string", enum: [t.name] }, parameters: params }, required: ["name", "parameters"] };
  });
  return {
    type: "array",
    minItems: 1,
    ...(parallel ? {} : { maxItems: 1 }),
    items: { type: "object", anyOf: branches },
    ...(Object.keys(defs).length ? { $defs: defs } : {}),
  };
}

/**
 * Tools, the tool mode and the constraint required/named put on the output. Throws 400 naming
 * the field: malformed tools, a named tool_choice not in tools, tool_choice without tools, `auto`
 * on a server without a tool-call parser.
 */
export function toolsOf(
  body: { tools?: unknown; tool_choice?: unknown; parallel_tool_calls?: boolean | null },
  settings: ToolSettings,
): { tools: ChatTool[] | null; mode: ToolMode; constraint: Constraint | null } {
  const choice = body.tool_choice == null ? null : toolChoiceSchema.safeParse(body.tool_choice);
  if (choice && !choice.success) {
    throw new ApiError(400, "invalid_request", 'tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}', "tool_choice");
  }
  const tools = body.tools == null ? null : parseTools(body.tools);
  const picked = choice?.data ?? (tools ? "auto" : "none");
  const parallel = body.parallel_tool_calls ?? true;
  if (!tools) {
    if (picked !== "none") throw new ApiError(400, "invalid_request", "tool_choice needs tools", "tool_choice");
    return { tools: null, mode: { kind: "none" }, constraint: null };
  }
  if (picked === "none") return { tools, mode: { kind: "none" }, constraint: null };
  if (picked === "auto") {
    if (!settings.parser)
      throw new ApiError(400, "invalid_request", 'tool_choice "auto" needs the server to read tool calls: start it with --tool-call-parser (hermes, llama3_json)', "tool_choice");
    return { tools, mode: { kind: "auto", parser: settings.parser, parallel }, constraint: null };
  }
  if (picked === "required") {
    const schema = requiredToolsSchema(tools, parallel);
    return { tools, mode: { kind: "required", parallel }, constraint: { spec: { type: "json_schema", schema: JSON.stringify(schema), anyWhitespace: true }, param: "tools" } };
  }
  const named = tools.find((t) => t.name === picked.function.name);
  if (!named) {
    throw new ApiError(400, "invalid_request", `tool_choice names '${picked.function.name}', which is not in tools (${tools.map((t) => t.name).join(", ")})`, "tool_choice");
  }
  return {
    tools,
    mode: { kind: "named", name: named.name },
    constraint: { spec: { type: "json_schema", schema: JSON.stringify(named.parameters), anyWhitespace: true }, param: `tools[${tools.indexOf(named)}].function.parameters` },
  };
}
