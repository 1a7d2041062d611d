// Plays Envoy against an ext_proc server: one gRPC connection, one stream per HTTP request,
// request headers then the body in chunks, as Envoy's ext_proc filter does with request body mode
// FULL_DUPLEX_STREAMED. Collects the answers into what a test checks: the headers set and
// removed, the envoy.lb metadata, the body streamed back, or the immediate response.

import { credentials, type Client, type ClientDuplexStream } from "@grpc/grpc-js";
import type { ProcessingResponse } from "../ext-proc-messages.ts";
import type { ProcessingRequest } from "../ext-proc-stream.ts";
import { protos } from "../protos.ts";

type Msg = Record<string, unknown>;

/** A raw ext_proc stream: send messages, await answers one by one. */
export class ExtProcStream {
  private readonly queue: ProcessingResponse[] = [];
  private waiters: ((r: ProcessingResponse | null) => void)[] = [];
  private ended = false;
  error: Error | null = null;

  constructor(readonly call: ClientDuplexStream<Msg, ProcessingResponse>) {
    call.on("data", (r: ProcessingResponse) => {
      const w = this.waiters.shift();
      if (w) w(r);
      else this.queue.push(r);
    });
    const finish = () => {
      this.ended = true;
      for (const w of this.waiters.splice(0)) w(null);
    };
    call.on("end", finish);
    call.on("error", (e) => {
      this.error = e;
      finish();
    });
  }

  send(msg: Msg): void {
    this.call.write(msg);
  }

  /** The next answer, or null once the server closed the stream. */
  next(): Promise<ProcessingResponse | null> {
    const r = this.queue.shift();
    if (r) return Promise.resolve(r);
    if (this.ended) return Promise.resolve(null);
    return new Promise((resolve) => this.waiters.push(resolve));
  }

  end(): void {
    this.call.end();
  }
}

export interface RequestAnswer {
  /** Set when the server refused the request. */
  immediate?: { status: number; headers: Record<string, string>; body: string; details?: string };
  /** Headers the request-headers answer sets (lower-case keys). */
  setHeaders: Record<string, string>;
  removeHeaders: string[];
  clearRouteCache: boolean;
  /** The envoy.lb dynamic metadata's x-gateway-destination-endpoint. */
  lbDestination?: string;
  /** The body streamed back (concatenated) and whether its last chunk ended the stream. */
  body: Buffer;
  bodyEnded: boolean;
  /** ms from the last body message sent to the answer that carries the destination (or refuses). */
  decisionMs: number;
}

export interface StubRequest {
  headers?: Record<string, string>;
  /** null: a request without a body (headers end the stream). A string or Buffer is sent as is, anything else as JSON. */
  body?: unknown;
  /** Body bytes per request_body message (default: all in one). */
  chunkBytes?: number;
}

const headerMap = (h: Record<string, string>) => ({ headers: Object.entries(h).map(([key, v]) => ({ key, raw_value: Buffer.from(v) })) });

/** Header options of a mutation as a plain map (raw_value preferred, as Envoy reads them). */
function headersOf(set: { header: { key: string; raw_value?: Buffer; value?: string } }[] | undefined): Record<string, string> {
  const out: Record<string, string> = {};
  for (const o of set ?? []) out[o.header.key.toLowerCase()] = o.header.raw_value?.length ? o.header.raw_value.toString() : (o.header.value ?? "");
  return out;
}

export class EnvoyStub {
  private readonly client: Client & { Process(): ClientDuplexStream<Msg, ProcessingResponse> };

  /** `ca`: the picker's port is TLS, and its certificate must chain to this CA (PEM). */
  constructor(address: string, ca?: Buffer) {
    const Ctor = protos().extProc;
    this.client = new Ctor(address, ca ? credentials.createSsl(ca, null, null, { checkServerIdentity: () => undefined }) : credentials.createInsecure()) as unknown as Client & {
      Process(): ClientDuplexStream<Msg, ProcessingResponse>;
    };
  }

  /** Opens a raw stream. */
  open(): ExtProcStream {
    return new ExtProcStream(this.client.Process());
  }

  /** One request's request phase: headers, body chunks; resolves once the body came back (or the request was refused). */
  async request(r: StubRequest): Promise<RequestAnswer> {
    const s = this.open();
    const body = r.body === null ? null : Buffer.isBuffer(r.body) ? r.body : Buffer.from(typeof r.body === "string" ? r.body : JSON.stringify(r.body ?? {}));
    const headers = { ":method": "POST", ":path": "/v1/completions", "content-type": "application/json", ...r.headers };
    s.send({ request_headers: { headers: headerMap(headers), end_of_stream: body === null } });
    let t0 = performance.now();
    if (body) {
      const step = r.chunkBytes ?? Math.max(1, body.length);
      for (let at = 0; at < body.length || at === 0; at += step) {
        const chunk = body.subarray(at, at + step);
        const last = at + step >= body.length;
        if (last) t0 = performance.now();
        s.send({ request_body: { body: chunk, end_of_stream: last } });
        if (last) break;
      }
    }
    try {
      return await collect(s, t0, body !== null);
    } finally {
      s.end();
    }
  }

  close(): void {
    this.client.close();
  }
}

async function collect(s: ExtProcStream, t0: number, hasBody: boolean): Promise<RequestAnswer> {
  const a: RequestAnswer = { setHeaders: {}, removeHeaders: [], clearRouteCache: false, body: Buffer.alloc(0), bodyEnded: false, decisionMs: Number.NaN };
  const parts: Buffer[] = [];
  for (;;) {
    const r = (await s.next()) as (ProcessingResponse & Msg) | null;
    if (!r) throw new Error(`ext_proc stream closed before the request was answered${s.error ? `: ${s.error.message}` : ""}`);
    if (r.immediate_response) {
      const i = r.immediate_response as unknown as { status: { code: number }; headers?: { set_headers?: never }; body?: Buffer; details?: string };
      a.decisionMs = performance.now() - t0;
      a.immediate = { status: i.status.code, headers: headersOf(i.headers?.set_headers), body: (i.body ?? Buffer.alloc(0)).toString(), details: i.details };
      return a;
    }
    if (r.request_headers) {
      a.decisionMs = performance.now() - t0;
      const c = r.request_headers.response;
      a.setHeaders = headersOf(c?.header_mutation?.set_headers as never);
      a.removeHeaders = c?.header_mutation?.remove_headers ?? [];
      a.clearRouteCache = c?.clear_route_cache ?? false;
      const lb = (r.dynamic_metadata?.fields?.["envoy.lb"] as { structValue?: { fields?: Record<string, { stringValue?: string }> } } | undefined)?.structValue;
      a.lbDestination = lb?.fields?.["x-gateway-destination-endpoint"]?.stringValue;
      if (!hasBody) return a;
    }
    if (r.request_body) {
      const sr = r.request_body.response?.body_mutation?.streamed_response;
      if (sr?.body) parts.push(Buffer.from(sr.body));
      if (sr?.end_of_stream) {
        a.body = Buffer.concat(parts);
        a.bodyEnded = true;
        return a;
      }
    }
  }
}

export type { ProcessingRequest, ProcessingResponse };
