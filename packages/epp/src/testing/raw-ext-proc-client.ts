// A lean ext_proc client for load tests: plain node:http2 and gRPC's 5-byte message framing, with
// the messages encoded once up front, so the load generator costs a fraction of a grpc-js client
// and the picker, not the client, is what a bench measures (Envoy's own client is C++).

import { connect, type ClientHttp2Session } from "node:http2";
import type { ProcessingResponse } from "../ext-proc-messages.ts";
import { protos } from "../protos.ts";

const PATH = "/envoy.service.ext_proc.v3.ExternalProcessor/Process";

interface Codec {
  requestSerialize(v: unknown): Buffer;
  responseDeserialize(b: Buffer): ProcessingResponse;
}

function codec(): Codec {
  return (protos().extProc.service as unknown as { Process: Codec }).Process;
}

/** One gRPC length-prefixed message. */
function frame(message: Buffer): Buffer {
  const out = Buffer.allocUnsafe(5 + message.length);
  out[0] = 0;
  out.writeUInt32BE(message.length, 1);
  message.copy(out, 5);
  return out;
}

/** The framed request_headers and request_body messages of one HTTP request, made once. */
export interface EncodedRequest {
  headers: Buffer;
  body: Buffer;
}

/** Encodes a POST with `body` (one request_body message that ends the stream). */
export function encodeRequest(body: Buffer, path = "/v1/chat/completions"): EncodedRequest {
  const c = codec();
  const hv = (key: string, v: string) => ({ key, raw_value: Buffer.from(v) });
  const headers = [hv(":method", "POST"), hv(":path", path), hv(":authority", "gateway"), hv("content-type", "application/json"), hv("content-length", String(body.length))];
  return {
    headers: frame(c.requestSerialize({ request_headers: { headers: { headers }, end_of_stream: false } })),
    body: frame(c.requestSerialize({ request_body: { body, end_of_stream: true } })),
  };
}

export interface RawAnswer {
  /** The destination the request-headers answer set, or null when the request was refused. */
  destination: string | null;
  /** HTTP status of an immediate response (0 when routed). */
  status: number;
  /** ms from writing the body message to receiving the answer that routes or refuses. */
  decisionMs: number;
}

export class RawExtProcClient {
  private readonly session: ClientHttp2Session;
  private readonly codec = codec();

  constructor(address: string) {
    this.session = connect(`http://${address}`);
    this.session.on("error", () => {});
  }

  /** Plays one request phase; resolves once the body came back (or the request was refused). */
  request(req: EncodedRequest): Promise<RawAnswer> {
    return new Promise((resolve, reject) => {
      const s = this.session.request({ ":method": "POST", ":path": PATH, "content-type": "application/grpc", te: "trailers" });
      let buf: Buffer = Buffer.alloc(0);
      let t0 = 0;
      const answer: RawAnswer = { destination: null, status: 0, decisionMs: Number.NaN };
      let done = false;
      // Half-closing (as Envoy does once it has its answers) lets the server end the stream
      // cleanly; resetting every stream instead trips HTTP/2 rapid-reset protection.
      const finish = (err?: Error) => {
        if (done) return;
        done = true;
        s.end();
        if (err) reject(err);
        else resolve(answer);
      };
      s.on("data", (chunk: Buffer) => {
        buf = buf.length ? Buffer.concat([buf, chunk]) : chunk;
        while (buf.length >= 5 && buf.length >= 5 + buf.readUInt32BE(1)) {
          const len = buf.readUInt32BE(1);
          const msg = this.codec.responseDeserialize(buf.subarray(5, 5 + len));
          buf = buf.subarray(5 + len);
          if (msg.immediate_response) {
            answer.decisionMs = performance.now() - t0;
            answer.status = msg.immediate_response.status.code;
            return finish();
          }
          if (msg.request_headers) {
            answer.decisionMs = performance.now() - t0;
            const set = msg.request_headers.response.header_mutation?.set_headers ?? [];
            answer.destination = set.find((h) => h.header.key === "x-gateway-destination-endpoint")?.header.raw_value.toString() ?? null;
          }
          if (msg.request_body?.response.body_mutation?.streamed_response.end_of_stream) return finish();
        }
      });
      s.on("error", (e) => finish(e));
      s.on("close", () => {
        if (Number.isNaN(answer.decisionMs)) finish(new Error(`ext_proc stream closed before an answer (rst code ${s.rstCode})`));
      });
      s.write(req.headers);
      t0 = performance.now();
      s.write(req.body);
    });
  }

  close(): void {
    this.session.close();
  }
}
