// Every field the OpenAI API or vLLM's OpenAI server defines for /v1/chat/completions and
// /v1/completions, and what this gateway does with it: serves it, takes it as a label that
// changes no output, or refuses it by name unless it holds the value that changes nothing. A field
// neither defines is ignored and logged once (as vLLM does); a field of the other endpoint is
// refused. The table is the one source of docs/openai-api.md's field list.

export type Endpoint = "chat" | "completion";

export interface RequestField {
  name: string;
  on: Endpoint[];
  from: "OpenAI" | "vLLM" | "rngd-pd";
  /** served: implemented; label: accepted, and by definition changes no output; refused: 400 unless `neutral` holds. */
  status: "served" | "label" | "refused";
  /** Refused fields: the value(s) that change nothing, accepted (null and absent always are). */
  neutral?: (v: unknown) => boolean;
  /** What the neutral value is, for the docs. */
  neutralText?: string;
  note: string;
}

const BOTH: Endpoint[] = ["chat", "completion"];
const CHAT: Endpoint[] = ["chat"];
const COMPLETION: Endpoint[] = ["completion"];

const is = (x: unknown) => (v: unknown) => v === x;
const isEmpty = (v: unknown) => (Array.isArray(v) && v.length === 0) || (typeof v === "object" && v !== null && Object.keys(v).length === 0);

function served(name: string, on: Endpoint[], from: RequestField["from"], note: string): RequestField {
  return { name, on, from, status: "served", note };
}
function refused(name: string, on: Endpoint[], from: RequestField["from"], note: string, neutral?: [(v: unknown) => boolean, string]): RequestField {
  return { name, on, from, status: "refused", note, ...(neutral ? { neutral: neutral[0], neutralText: neutral[1] } : {}) };
}
function label(name: string, on: Endpoint[], from: RequestField["from"], note: string): RequestField {
  return { name, on, from, status: "label", note };
}

const REMOVED_GUIDED = "removed from vLLM in 0.12; use structured_outputs";

export const REQUEST_FIELDS: RequestField[] = [
  served("model", BOTH, "OpenAI", "the served model's id; absent: the only one served"),
  served(
    "messages",
    CHAT,
    "OpenAI",
    "text content (a string or text parts), roles system, developer, user, assistant (with tool_calls), tool (with tool_call_id); `name` is passed to the template",
  ),
  served("prompt", COMPLETION, "OpenAI", "a string, token ids, or a batch of up to 64 of either (each its own generation, through the prefix cache)"),
  served("max_tokens", BOTH, "OpenAI", "completions default 16; chat default: the rest of the context"),
  served("max_completion_tokens", CHAT, "OpenAI", "as max_tokens (wins over it)"),
  served("temperature", BOTH, "OpenAI", "default: the model's (generation config), else 1; 0 is greedy"),
  served("top_p", BOTH, "OpenAI", "nucleus sampling, over what min_p and top_k kept; default: the model's, else 1"),
  served("top_k", BOTH, "vLLM", "-1 or 0: off; default: the model's, else off"),
  served(
    "min_p",
    BOTH,
    "vLLM",
    "[0, 1]: keeps the tokens whose probability, after temperature, is at least min_p times the most likely one's (before top_k and top_p, as vLLM); default: the model's, else 0 (off); greedy ignores it",
  ),
  served("seed", BOTH, "OpenAI", "the draw of token p is a function of (seed, p): PD reproduces solo"),
  served("stop", BOTH, "OpenAI", "up to 4 strings, cut from the text"),
  served("stream", BOTH, "OpenAI", "server-sent events"),
  served(
    "stream_options",
    BOTH,
    "OpenAI",
    "include_usage (usage also gives prompt_tokens_details.cached_tokens: prompt tokens from the prefix cache); vLLM's continuous_usage_stats is refused",
  ),
  served("logit_bias", BOTH, "OpenAI", "token id (decimal string) to a bias in [-100, 100], added before sampling; an id outside the vocabulary is a 400"),
  served("logprobs", BOTH, "OpenAI", "chat: true with top_logprobs 0-20; completions: 0-5 alternatives"),
  served("top_logprobs", CHAT, "OpenAI", "alternatives per token with logprobs"),
  served("echo", COMPLETION, "OpenAI", "the prompt before the completion (scored with logprobs)"),
  served("response_format", BOTH, "OpenAI", "text, json_object, json_schema (name, schema, strict, description), structural_tag: enforced by the grammar engine"),
  served("structured_outputs", BOTH, "vLLM", "exactly one of json, regex, choice, grammar, json_object, structural_tag; disable_any_whitespace; disable_additional_properties"),
  served("tools", CHAT, "OpenAI", "functions (name, description, parameters as an object schema), rendered into the prompt"),
  served("tool_choice", CHAT, "OpenAI", "none, auto (parsed by --tool-call-parser), required and named (enforced by the grammar engine)"),
  served("parallel_tool_calls", CHAT, "OpenAI", "false: at most one call (required: the grammar allows one; auto: the first is kept)"),
  served("ignore_eos", BOTH, "vLLM", "every end-of-sequence token is ignored: the completion runs to max_tokens (not with a structured output)"),
  served("min_tokens", BOTH, "vLLM", "end-of-sequence tokens cannot be sampled before this many tokens"),
  served(
    "n",
    BOTH,
    "OpenAI",
    "choices per prompt, from one prefill: the decode worker forks n streams from one KV import; choice i samples with seed + i; at most the decode batch width",
  ),
  served("best_of", COMPLETION, "OpenAI", "candidates per prompt (one prefill), of which the n with the highest cumulative log-probability are returned; not with stream"),
  served("presence_penalty", BOTH, "OpenAI", "[-2, 2], over the completion's tokens"),
  served("frequency_penalty", BOTH, "OpenAI", "[-2, 2], over the completion's tokens"),
  served("repetition_penalty", BOTH, "vLLM", "(0, 10], over the prompt's and the completion's tokens; default: the model's, else 1"),
  served("timeout", BOTH, "rngd-pd", "the request's own deadline in seconds (shortens AIRM_REQUEST_TIMEOUT_S)"),
  label("user", BOTH, "OpenAI", "an end-user id for the operator's records; changes no output"),
  label("safety_identifier", CHAT, "OpenAI", "an end-user id for the operator's records; changes no output"),
  label("prompt_cache_key", CHAT, "OpenAI", "a cache routing hint; the prefix cache works without it"),
  refused("best_of", CHAT, "vLLM", "best_of on chat (a completions field)", [is(1), "1"]),

  refused("use_beam_search", BOTH, "vLLM", "beam search", [is(false), "false"]),
  refused("length_penalty", BOTH, "vLLM", "length_penalty (beam search)", [is(1), "1"]),
  refused("stop_token_ids", BOTH, "vLLM", "stop_token_ids", [isEmpty, "[]"]),
  refused("include_stop_str_in_output", BOTH, "vLLM", "include_stop_str_in_output", [is(false), "false"]),
  refused("skip_special_tokens", BOTH, "vLLM", "keeping special tokens in the text", [is(true), "true"]),
  refused("spaces_between_special_tokens", BOTH, "vLLM", "spaces_between_special_tokens=false", [is(true), "true"]),
  refused("truncate_prompt_tokens", BOTH, "vLLM", "prompt truncation"),
  refused("truncation_side", BOTH, "vLLM", "prompt truncation"),
  refused("prompt_logprobs", BOTH, "vLLM", "prompt_logprobs (completions' echo with logprobs scores the prompt)"),
  refused("allowed_token_ids", BOTH, "vLLM", "allowed_token_ids"),
  refused("priority", BOTH, "vLLM", "request priorities", [is(0), "0"]),
  refused("request_id", BOTH, "vLLM", "a client-chosen request id (the gateway names each request)"),
  refused("logits_processors", BOTH, "vLLM", "custom logits processors"),
  served("return_tokens_as_token_ids", BOTH, "vLLM", "log-probabilities name tokens as `token_id:<id>`"),
  refused("return_token_ids", BOTH, "vLLM", "return_token_ids", [is(false), "false"]),
  served(
    "cache_salt",
    BOTH,
    "vLLM",
    "a non-empty string: prefix caching shares KV blocks only between requests with the same salt (it roots the block hash chain), so one tenant's prompts cannot be timed against another's",
  ),
  refused("kv_transfer_params", BOTH, "vLLM", "vLLM's KV connector parameters (this server moves KV itself)"),
  refused("vllm_xargs", BOTH, "vLLM", "vllm_xargs"),
  refused("add_special_tokens", CHAT, "vLLM", "add_special_tokens=true on chat (the template writes the special tokens)", [is(false), "false"]),
  refused("add_special_tokens", COMPLETION, "vLLM", "add_special_tokens=false on completions", [is(true), "true"]),
  refused("watermarking", BOTH, "vLLM", "watermarking"),
  refused("thinking_token_budget", BOTH, "vLLM", "thinking_token_budget (no reasoning parser)"),
  refused("include_reasoning", BOTH, "vLLM", "include_reasoning=false (no reasoning parser)", [is(true), "true"]),
  refused("session_id", BOTH, "vLLM", "session_id"),
  refused("stream_interval", BOTH, "vLLM", "stream_interval other than 1", [is(1), "1"]),
  refused("repetition_detection", BOTH, "vLLM", "repetition_detection"),
  refused("return_token_offsets", BOTH, "vLLM", "return_token_offsets", [is(false), "false"]),
  refused("return_prompt_text", BOTH, "vLLM", "return_prompt_text", [is(false), "false"]),
  refused("ec_transfer_params", BOTH, "vLLM", "ec_transfer_params"),
  refused("routed_experts_prompt_start", BOTH, "vLLM", "routed_experts_prompt_start (no MoE)", [is(0), "0"]),
  refused("return_mm_kwargs", BOTH, "vLLM", "multimodal inputs", [(v) => typeof v === "boolean", "a boolean (no multimodal inputs)"]),
  refused("guided_json", BOTH, "vLLM", REMOVED_GUIDED),
  refused("guided_regex", BOTH, "vLLM", REMOVED_GUIDED),
  refused("guided_choice", BOTH, "vLLM", REMOVED_GUIDED),
  refused("guided_grammar", BOTH, "vLLM", REMOVED_GUIDED),
  refused("guided_whitespace_pattern", BOTH, "vLLM", REMOVED_GUIDED),
  refused("guided_decoding_backend", BOTH, "vLLM", "removed from vLLM in 0.12 (the backend is the server's: xgrammar)"),
  refused("bad_words", CHAT, "vLLM", "bad_words", [isEmpty, "[]"]),
  refused("logprob_token_ids", CHAT, "vLLM", "logprob_token_ids"),
  refused("add_generation_prompt", CHAT, "vLLM", "add_generation_prompt=false", [is(true), "true"]),
  refused("continue_final_message", CHAT, "vLLM", "continue_final_message", [is(false), "false"]),
  refused("echo", CHAT, "vLLM", "echo on chat completions", [is(false), "false"]),
  refused("documents", CHAT, "vLLM", "documents (RAG templates)"),
  refused("chat_template", CHAT, "vLLM", "a request's own chat template"),
  refused("chat_template_kwargs", CHAT, "vLLM", "chat_template_kwargs", [isEmpty, "{}"]),
  refused("mm_processor_kwargs", CHAT, "vLLM", "multimodal inputs"),
  refused("media_io_kwargs", CHAT, "vLLM", "multimodal inputs"),
  refused("reasoning_effort", CHAT, "OpenAI", "reasoning_effort (no reasoning model)"),
  refused("verbosity", CHAT, "OpenAI", "verbosity"),
  refused("store", CHAT, "OpenAI", "storing completions", [is(false), "false"]),
  refused("metadata", CHAT, "OpenAI", "metadata (it goes with store)", [isEmpty, "{}"]),
  refused("service_tier", CHAT, "OpenAI", "service tiers other than auto/default", [(v) => v === "auto" || v === "default", '"auto" or "default"']),
  refused("modalities", CHAT, "OpenAI", "output modalities other than text", [(v) => Array.isArray(v) && v.every((m) => m === "text"), '["text"]']),
  refused("audio", CHAT, "OpenAI", "audio output"),
  refused("prediction", CHAT, "OpenAI", "predicted outputs"),
  refused("web_search_options", CHAT, "OpenAI", "web search"),
  refused("functions", CHAT, "OpenAI", "the deprecated functions (use tools)"),
  refused("function_call", CHAT, "OpenAI", "the deprecated function_call (use tool_choice)"),
  refused("suffix", COMPLETION, "OpenAI", "suffix", [is(""), '""']),
  refused("prompt_embeds", COMPLETION, "vLLM", "prompt embeddings"),
  refused("max_repetition_pattern_size", COMPLETION, "vLLM", "repetition detection", [is(0), "0"]),
  refused("min_repetition_pattern_size", COMPLETION, "vLLM", "repetition detection", [is(0), "0"]),
  refused("repetition_min_count", COMPLETION, "vLLM", "repetition detection", [is(0), "0"]),
];

/** The fields a request of `kind` may carry. */
export function fieldsOf(kind: Endpoint): Map<string, RequestField> {
  return new Map(REQUEST_FIELDS.filter((f) => f.on.includes(kind)).map((f) => [f.name, f]));
}

/** The markdown table of every field (docs/openai-api.md). */
export function requestFieldTable(): string {
  const rows = REQUEST_FIELDS.map((f) => {
    const here = f.status === "served" ? "served" : f.status === "label" ? "accepted (a label)" : f.neutralText ? `refused unless ${f.neutralText}` : "refused";
    const on = f.on.length === 2 ? "both" : f.on[0] === "chat" ? "chat" : "completions";
    return `| \`${f.name}\` | ${on} | ${f.from} | ${here} | ${f.note.replace(/\|/g, "\\|")} |`;
  });
  return ["| field | endpoint | defined by | here | what it does here |", "|---|---|---|---|---|", ...rows].join("\n");
}
