import { expect, test } from "vitest";
import { BODY_CHUNK_BYTES, immediateAnswer, requestHeadersAnswer, streamedBody } from "./ext-proc-messages.ts";

test("bodies stream back in 62 000-byte chunks; only the last ends the stream; an empty body is one empty chunk", () => {
  const body = Buffer.alloc(BODY_CHUNK_BYTES * 2 + 1, 7);
  const parts = streamedBody("request_body", body, true).map((r) => r.request_body!.response.body_mutation!.streamed_response);
  expect(parts.map((p) => [p.body.length, p.end_of_stream])).toEqual([
    [BODY_CHUNK_BYTES, false],
    [BODY_CHUNK_BYTES, false],
    [1, true],
  ]);
  expect(Buffer.concat(parts.map((p) => p.body)).equals(body)).toBe(true);
  expect(streamedBody("response_body", Buffer.alloc(0), true).map((r) => r.response_body!.response.body_mutation!.streamed_response.end_of_stream)).toEqual([true]);
  expect(streamedBody("request_body", Buffer.alloc(10), false)[0].request_body!.response.body_mutation!.streamed_response.end_of_stream).toBe(false);
});

test("the headers answer sets the destination, the prefill host or removes a client's, and the envoy.lb metadata", () => {
  const pd = requestHeadersAnswer({ destination: "10.0.0.1:8000", prefill: "10.0.0.2:8000", bodyBytes: 42 });
  const set = pd.request_headers!.response.header_mutation!.set_headers!.map((h) => [h.header.key, h.header.raw_value.toString()]);
  expect(set).toEqual([
    ["x-gateway-destination-endpoint", "10.0.0.1:8000"],
    ["x-prefiller-host-port", "10.0.0.2:8000"],
    ["Content-Length", "42"],
  ]);
  expect(pd.request_headers!.response.clear_route_cache).toBe(true);
  expect(pd.request_headers!.response.header_mutation!.remove_headers).toBeUndefined();
  expect(pd.dynamic_metadata).toEqual({ fields: { "envoy.lb": { structValue: { fields: { "x-gateway-destination-endpoint": { stringValue: "10.0.0.1:8000" } } } } } });
  const solo = requestHeadersAnswer({ destination: "10.0.0.1:8000", prefill: null, bodyBytes: 0 });
  expect(solo.request_headers!.response.header_mutation!.remove_headers).toEqual(["x-prefiller-host-port"]);
  expect(solo.request_headers!.response.header_mutation!.set_headers!.map((h) => h.header.key)).toEqual(["x-gateway-destination-endpoint"]);
});

test("an immediate answer carries the status, JSON content type and the OpenAI error body", () => {
  const r = immediateAnswer(429, "all_endpoints_saturated", "busy").immediate_response!;
  expect(r.status.code).toBe(429);
  expect(r.headers!.set_headers![0].header.key).toBe("content-type");
  expect(JSON.parse(r.body!.toString())).toEqual({ error: { message: "busy", type: "invalid_request_error", param: null, code: "all_endpoints_saturated" } });
  expect(JSON.parse(immediateAnswer(503, "x", "y").immediate_response!.body!.toString()).error.type).toBe("server_error");
});
