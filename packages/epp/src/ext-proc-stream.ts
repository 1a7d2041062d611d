// One ext_proc stream (one HTTP request through Envoy), in the order GIE v1.5.0 answers with
// request body mode FULL_DUPLEX_STREAMED: the request headers are not answered until the body has
// ended; then the headers answer carrying the destination goes out, followed by the body streamed
// back unchanged. A refusal is one immediate response, after which the stream is closed. Response
// headers, body chunks and trailers are passed through as they come. What the destination is, is
// the router's business.

import type { ServerDuplexStream } from "@grpc/grpc-js";
import { immediateAnswer, requestHeadersAnswer, responseHeadersAnswer, streamedBody, trailersAnswer, type ProcessingResponse } from "./ext-proc-messages.ts";
import type { Log } from "./log.ts";

interface HeaderValue {
  key: string;
  value?: string;
  raw_value?: Buffer;
}

/** envoy.service.ext_proc.v3.ProcessingRequest as decoded (oneofs: `request` names the set field). */
export interface ProcessingRequest {
  request?: "request_headers" | "response_headers" | "request_body" | "response_body" | "request_trailers" | "response_trailers";
  request_headers?: { headers?: { headers?: HeaderValue[] }; end_of_stream?: boolean };
  response_headers?: { headers?: { headers?: HeaderValue[] }; end_of_stream?: boolean };
  request_body?: { body?: Buffer; end_of_stream?: boolean };
  response_body?: { body?: Buffer; end_of_stream?: boolean };
}

/** Where a request goes, or why it does not. */
export type RouteAnswer = { kind: "route"; destination: string; prefill: string | null } | { kind: "refuse"; status: number; code: string; message: string; param?: string | null };

export interface Router {
  /** The answer for one request (`body` null when it has none). Must not throw. */
  route(body: Buffer | null, headers: Map<string, string>): RouteAnswer | Promise<RouteAnswer>;
}

export interface StreamOptions {
  /** A request body longer than this is refused with 413 (bytes). */
  maxBodyBytes: number;
  log: Log;
  /** Called with each refusal's status (metrics). */
  onRefused?: (status: number, code: string) => void;
}

/** Header values as GIE reads them: raw_value when set, else value; keys as Envoy sent them (lower case). */
function headerMap(headers: HeaderValue[] | undefined): Map<string, string> {
  const m = new Map<string, string>();
  for (const h of headers ?? []) m.set(h.key, h.raw_value && h.raw_value.length > 0 ? h.raw_value.toString("latin1") : (h.value ?? ""));
  return m;
}

/** Serves one Process stream until Envoy closes it. */
export function serveProcessStream(call: ServerDuplexStream<ProcessingRequest, ProcessingResponse>, router: Router, options: StreamOptions): void {
  let headers = new Map<string, string>();
  const chunks: Buffer[] = [];
  let bodyBytes = 0;
  let answered = false;
  let closed = false;

  const send = (r: ProcessingResponse) => {
    if (!closed) call.write(r);
  };
  const refuse = (status: number, code: string, message: string, param: string | null = null) => {
    options.onRefused?.(status, code);
    send(immediateAnswer(status, code, message, param));
    closed = true;
    call.end();
  };
  const wholeBody = () => (chunks.length === 1 ? chunks[0] : Buffer.concat(chunks, bodyBytes));
  /** Routes once the body is complete (or absent); `bodyEnds` is false when trailers still follow. */
  // Answers leave in order: one that waits for the routing (a tokenizer call) holds the later ones.
  let pending: Promise<void> | null = null;
  const inOrder = (f: () => void) => {
    if (pending) pending = pending.then(f);
    else f();
  };
  const answer = (a: RouteAnswer, body: Buffer | null, bodyEnds: boolean) => {
    if (a.kind === "refuse") return refuse(a.status, a.code, a.message, a.param ?? null);
    send(requestHeadersAnswer({ destination: a.destination, prefill: a.prefill, bodyBytes: body?.length ?? 0 }));
    if (body) for (const r of streamedBody("request_body", body, bodyEnds)) send(r);
  };
  const answerRequest = (body: Buffer | null, bodyEnds: boolean) => {
    answered = true;
    const a = router.route(body, headers);
    if (!(a instanceof Promise)) return answer(a, body, bodyEnds);
    pending = a.then((x) => answer(x, body, bodyEnds));
  };

  call.on("data", (req: ProcessingRequest) => {
    if (closed) return;
    switch (req.request) {
      case "request_headers":
        headers = headerMap(req.request_headers?.headers?.headers);
        if (req.request_headers?.end_of_stream) answerRequest(null, true);
        return;
      case "request_body": {
        if (answered) return;
        const chunk = req.request_body?.body ?? Buffer.alloc(0);
        bodyBytes += chunk.length;
        if (bodyBytes > options.maxBodyBytes) return refuse(413, "request_too_large", `request body is larger than ${options.maxBodyBytes} bytes`);
        if (chunk.length) chunks.push(chunk);
        if (req.request_body?.end_of_stream) answerRequest(wholeBody(), true);
        return;
      }
      case "request_trailers":
        // GIE v1.5.0 ignores request trailers; a body that ends with trailers is routed here.
        if (!answered) answerRequest(wholeBody(), false);
        inOrder(() => send(trailersAnswer("request_trailers")));
        return;
      case "response_headers":
        inOrder(() => send(responseHeadersAnswer()));
        return;
      case "response_body": {
        const body = req.response_body?.body ?? Buffer.alloc(0);
        const ends = req.response_body?.end_of_stream ?? false;
        inOrder(() => {
          for (const r of streamedBody("response_body", body, ends)) send(r);
        });
        return;
      }
      case "response_trailers":
        inOrder(() => send(trailersAnswer("response_trailers")));
        return;
      default:
        options.log.warn({ request: req.request }, "ext_proc message with no known phase ignored");
    }
  });
  call.on("end", () => {
    if (!closed) {
      closed = true;
      call.end();
    }
  });
  call.on("error", (e) => {
    closed = true;
    options.log.debug({ err: e.message }, "ext_proc stream ended with an error");
  });
  call.on("cancelled", () => {
    closed = true;
  });
}
