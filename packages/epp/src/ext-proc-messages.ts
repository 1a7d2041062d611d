// The ext_proc answers, built as GIE v1.5.0 builds them (pkg/epp/handlers and pkg/common/envoy):
// the request-headers answer that carries the destination (header mutation, clear_route_cache,
// envoy.lb dynamic metadata), the body streamed back in 62 000-byte chunks, pass-through answers
// for the response phases, and the immediate response that refuses a request with an OpenAI
// error body. Plain objects in the shape of the trimmed protos (proto/), field names as there,
// except google.protobuf.Struct/Value, whose names protobufjs bundles in camelCase (structValue).

/** The header and dynamic-metadata key that names the destination (GIE's DestinationEndpointKey). */
export const DESTINATION_HEADER = "x-gateway-destination-endpoint";
/** The dynamic-metadata namespace Envoy's load balancer reads the destination from. */
export const DESTINATION_NAMESPACE = "envoy.lb";
/** The header that names the prefill pod to the decode pod (llm-d's routing-sidecar protocol). */
export const PREFILLER_HEADER = "x-prefiller-host-port";

/** GIE's BodyByteLimit: Envoy implementations take up to 64 KiB per streamed chunk; this keeps a margin. */
export const BODY_CHUNK_BYTES = 62_000;

/** envoy.config.core.v3.HeaderValueOption.HeaderAppendAction.OVERWRITE_IF_EXISTS_OR_ADD */
const OVERWRITE_IF_EXISTS_OR_ADD = 2;

export interface HeaderValueOption {
  header: { key: string; raw_value: Buffer };
  append_action?: number;
}

export interface HeaderMutation {
  set_headers?: HeaderValueOption[];
  remove_headers?: string[];
}

export interface CommonResponse {
  status?: number;
  header_mutation?: HeaderMutation;
  body_mutation?: { streamed_response: { body: Buffer; end_of_stream: boolean } };
  clear_route_cache?: boolean;
}

/** envoy.service.ext_proc.v3.ProcessingResponse (the fields the picker sets). */
export interface ProcessingResponse {
  request_headers?: { response: CommonResponse };
  response_headers?: { response: CommonResponse };
  request_body?: { response: CommonResponse };
  response_body?: { response: CommonResponse };
  request_trailers?: Record<string, never>;
  response_trailers?: Record<string, never>;
  immediate_response?: { status: { code: number }; headers?: HeaderMutation; body?: Buffer; details?: string };
  dynamic_metadata?: { fields: Record<string, unknown> };
}

function header(key: string, value: string, overwrite = false): HeaderValueOption {
  return overwrite ? { header: { key, raw_value: Buffer.from(value) }, append_action: OVERWRITE_IF_EXISTS_OR_ADD } : { header: { key, raw_value: Buffer.from(value) } };
}

export interface Destination {
  /** "ip:port" of the endpoint Envoy sends the request to. */
  destination: string;
  /** "ip:port" of the prefill endpoint, for x-prefiller-host-port (null: none; a client's is removed). */
  prefill: string | null;
  /** The body's length for Content-Length (GIE sets it when the body is not empty). */
  bodyBytes: number;
}

/**
 * The answer to the request headers once the destination is known: sets
 * x-gateway-destination-endpoint (and x-prefiller-host-port, or removes a client's), Content-Length,
 * clears the route cache, and names the destination in the envoy.lb dynamic metadata.
 */
export function requestHeadersAnswer(d: Destination): ProcessingResponse {
  const set = [header(DESTINATION_HEADER, d.destination, true)];
  if (d.prefill) set.push(header(PREFILLER_HEADER, d.prefill, true));
  if (d.bodyBytes > 0) set.push(header("Content-Length", String(d.bodyBytes)));
  const mutation: HeaderMutation = { set_headers: set };
  if (!d.prefill) mutation.remove_headers = [PREFILLER_HEADER];
  return {
    request_headers: { response: { clear_route_cache: true, header_mutation: mutation } },
    dynamic_metadata: { fields: { [DESTINATION_NAMESPACE]: { structValue: { fields: { [DESTINATION_HEADER]: { stringValue: d.destination } } } } } },
  };
}

/** `body` as streamed body answers of at most BODY_CHUNK_BYTES; the last carries `endOfStream` (an empty body is one empty answer). */
export function streamedBody(phase: "request_body" | "response_body", body: Buffer, endOfStream: boolean): ProcessingResponse[] {
  const out: ProcessingResponse[] = [];
  let at = 0;
  do {
    const chunk = body.subarray(at, at + BODY_CHUNK_BYTES);
    at += chunk.length;
    out.push({ [phase]: { response: { body_mutation: { streamed_response: { body: chunk, end_of_stream: endOfStream && at >= body.length } } } } });
  } while (at < body.length);
  return out;
}

/** The answer to the response headers: GIE's debugging header, nothing else changed. */
export function responseHeadersAnswer(): ProcessingResponse {
  return { response_headers: { response: { header_mutation: { set_headers: [header("x-went-into-resp-headers", "true")] } } } };
}

/** The answer to request or response trailers: no change. */
export function trailersAnswer(phase: "request_trailers" | "response_trailers"): ProcessingResponse {
  return { [phase]: {} };
}

/** The OpenAI error body: {"error": {"message", "type", "param", "code"}}. */
export function openaiErrorBody(status: number, code: string, message: string, param: string | null = null): string {
  return JSON.stringify({ error: { message, type: status >= 500 ? "server_error" : "invalid_request_error", param, code } });
}

/** Refuses the request: Envoy answers the client with `status`, a JSON OpenAI error and content-type application/json. */
export function immediateAnswer(status: number, code: string, message: string, param: string | null = null): ProcessingResponse {
  return {
    immediate_response: {
      status: { code: status },
      headers: { set_headers: [header("content-type", "application/json", true)] },
      body: Buffer.from(openaiErrorBody(status, code, message, param)),
      details: `airm_epp_${code}`,
    },
  };
}
