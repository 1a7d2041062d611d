// Markdown tables of the contract's schemas, printed from the schemas themselves (through zod's
// JSON Schema), so docs/internal-api.md cannot drift from what the worker and gateway check.

import { GrammarSpecSchema } from "@airm/grammar";
import { z } from "zod";
import { ErrorBodySchema } from "./api-error.ts";
import {
  ChatMessageSchema,
  ChatToolSchema,
  DecodeRequestSchema,
  EchoSchema,
  FirstTokenSchema,
  PrefillRequestSchema,
  PrefillResponseSchema,
  PromptInputSchema,
  ReleaseRequestSchema,
  ReleaseResponseSchema,
  DetokenizeRequestSchema,
  DetokenizeResponseSchema,
  KvHoldRequestSchema,
  KvHoldResponseSchema,
  TokenizeRequestSchema,
  TokenizeResponseSchema,
  TokenLogprobsSchema,
  WorkerEventSchema,
  WorkerHealthSchema,
} from "./schemas.ts";

/** The schemas the document describes, by the name its examples use. */
export const INTERNAL_API_SCHEMAS: Record<string, { schema: z.ZodType; io: "input" | "output"; what: string }> = {
  PrefillRequest: { schema: PrefillRequestSchema, io: "input", what: "body of POST /internal/prefill (prefill) and POST /internal/generate (solo)" },
  PromptInput: { schema: PromptInputSchema, io: "input", what: "`input` of PrefillRequest: exactly one of" },
  ChatMessage: { schema: ChatMessageSchema, io: "input", what: "one of PromptInput's `messages`" },
  ChatTool: { schema: ChatToolSchema, io: "input", what: "one of PromptInput's `tools`" },
  GrammarSpec: { schema: GrammarSpecSchema, io: "input", what: "`constraint` of PrefillRequest and DecodeRequest: what every generated token keeps to, by `type`" },
  DecodeRequest: { schema: DecodeRequestSchema, io: "input", what: "body of POST /internal/decode (decode)" },
  ReleaseRequest: { schema: ReleaseRequestSchema, io: "input", what: "body of POST /internal/release (every role)" },
  KvHoldRequest: { schema: KvHoldRequestSchema, io: "input", what: "body of POST /internal/kv-hold (decode role)" },
  KvHoldResponse: { schema: KvHoldResponseSchema, io: "output", what: "answer of POST /internal/kv-hold" },
  TokenizeRequest: { schema: TokenizeRequestSchema, io: "input", what: "body of POST /internal/tokenize (every role)" },
  TokenizeResponse: { schema: TokenizeResponseSchema, io: "output", what: "answer of POST /internal/tokenize" },
  DetokenizeRequest: { schema: DetokenizeRequestSchema, io: "input", what: "body of POST /internal/detokenize (every role)" },
  DetokenizeResponse: { schema: DetokenizeResponseSchema, io: "output", what: "answer of POST /internal/detokenize" },
  ReleaseResponse: { schema: ReleaseResponseSchema, io: "output", what: "answer of POST /internal/release" },
  PrefillResponse: { schema: PrefillResponseSchema, io: "output", what: "answer of POST /internal/prefill" },
  FirstToken: { schema: FirstTokenSchema, io: "output", what: "the first token (`first` of PrefillResponse, and the solo `first` event)" },
  TokenLogprobs: { schema: TokenLogprobsSchema, io: "output", what: "`logprobs` of FirstToken and of a token event (each entry of `top` has the same fields but `top`)" },
  Echo: { schema: EchoSchema, io: "output", what: "`echo` of FirstToken: the prompt, when the request set echo" },
  WorkerEvent: { schema: WorkerEventSchema, io: "output", what: "one NDJSON line of /internal/decode and /internal/generate, by `type`" },
  WorkerHealth: { schema: WorkerHealthSchema, io: "output", what: "answer of GET /health" },
  ErrorBody: { schema: ErrorBodySchema, io: "output", what: "every error answer (4xx/5xx JSON), also the gateway's" },
};

type Json = Record<string, unknown>;

function typeOf(s: Json): string {
  if (s.const !== undefined) return `\`${JSON.stringify(s.const)}\``;
  if (Array.isArray(s.enum)) return s.enum.map((v) => `\`${JSON.stringify(v)}\``).join(" \\| ");
  const alts = (s.anyOf ?? s.oneOf) as Json[] | undefined;
  if (alts) return alts.map(typeOf).join(" or ");
  const bounds: string[] = [];
  if (typeof s.minimum === "number" && s.minimum > -Number.MAX_SAFE_INTEGER) bounds.push(`>= ${s.minimum}`);
  if (typeof s.exclusiveMinimum === "number") bounds.push(`> ${s.exclusiveMinimum}`);
  if (typeof s.maximum === "number" && s.maximum < Number.MAX_SAFE_INTEGER) bounds.push(`<= ${s.maximum}`);
  switch (s.type) {
    case "array":
      return `array of ${typeOf(s.items as Json)}${typeof s.minItems === "number" && s.minItems > 0 ? ` (at least ${s.minItems})` : ""}`;
    case "object": {
      const props = Object.keys((s.properties as Json) ?? {});
      return props.length ? `{${props.join(", ")}}` : "object";
    }
    case "null":
      return "null";
    default:
      return `${s.type as string}${bounds.length ? ` ${bounds.join(", ")}` : ""}`;
  }
}

function objectTable(s: Json): string {
  const props = (s.properties as Record<string, Json>) ?? {};
  const required = new Set((s.required as string[]) ?? []);
  const rows = Object.entries(props).map(([name, p]) => {
    const dflt = p.default !== undefined ? ` (default ${JSON.stringify(p.default)})` : "";
    const req = required.has(name) ? "yes" : "no";
    return `| \`${name}\` | ${typeOf(p)} | ${req} | ${String(p.description ?? "").replace(/\|/g, "\\|")}${dflt} |`;
  });
  return ["| field | type | required | meaning |", "|---|---|---|---|", ...rows].join("\n");
}

/** The markdown of every schema in INTERNAL_API_SCHEMAS, in order. */
export function schemaTables(): string {
  const out: string[] = [];
  for (const [name, { schema, io, what }] of Object.entries(INTERNAL_API_SCHEMAS)) {
    const js = z.toJSONSchema(schema, { io, unrepresentable: "any" }) as Json;
    out.push(`### ${name}`, "", `${what}.`, "");
    const alts = (js.oneOf ?? js.anyOf) as Json[] | undefined;
    if (alts) {
      for (const alt of alts) {
        const props = (alt.properties as Record<string, Json>) ?? {};
        const title = props.type?.const !== undefined ? `\`type: "${String(props.type.const)}"\`` : `\`${Object.keys(props).join(", ")}\``;
        out.push(`${title}${alt.description ? `: ${String(alt.description)}` : ""}`, "", objectTable(alt), "");
      }
    } else {
      out.push(objectTable(js), "");
      for (const [field, p] of Object.entries((js.properties as Record<string, Json>) ?? {})) {
        const objects = ((p.anyOf as Json[] | undefined) ?? [p]).filter((a) => a.type === "object");
        const inner = objects.length === 1 ? objects[0] : undefined;
        if (inner && Object.keys((inner.properties as Json) ?? {}).length > 0) out.push(`\`${field}\`:`, "", objectTable(inner), "");
      }
    }
  }
  return out.join("\n").trimEnd();
}
