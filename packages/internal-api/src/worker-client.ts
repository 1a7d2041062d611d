// The wire mechanics of the contract: route paths, NDJSON framing of worker events (each line
// parsed with WorkerEventSchema, with an idle timeout between lines), and a typed client the
// gateway (and tests and benches) call workers with, over mutual TLS when given the deployment's
// TLS material. Raw network failures are thrown as they are (the caller decides whether a worker
// is down); answers that break the contract are ApiErrors.

import { ConfigError, INTERNAL_TOKEN_HEADER, type TlsMaterial } from "@airm/rm-core";
import { ApiError, OverloadedError } from "./api-error.ts";
import {
  DecodeRequestSchema,
  DetokenizeRequestSchema,
  DetokenizeResponseSchema,
  GenerateRequestSchema,
  KvHoldRequestSchema,
  KvHoldResponseSchema,
  LoraInfoSchema,
  LoraLoadRequestSchema,
  LoraUnloadRequestSchema,
  LoraUnloadResponseSchema,
  PrefillRequestSchema,
  PrefillResponseSchema,
  ReleaseRequestSchema,
  ReleaseResponseSchema,
  TokenizeRequestSchema,
  TokenizeResponseSchema,
  WorkerEventSchema,
  WorkerHealthSchema,
  type DecodeRequest,
  type DetokenizeRequest,
  type DetokenizeResponse,
  type GenerateRequest,
  type KvHoldRequest,
  type KvHoldResponse,
  type LoraInfoBody,
  type LoraLoadRequest,
  type LoraUnloadRequest,
  type LoraUnloadResponse,
  type PrefillRequest,
  type PrefillResponse,
  type ReleaseRequest,
  type ReleaseResponse,
  type TokenizeRequest,
  type TokenizeResponse,
  type WorkerEvent,
  type WorkerHealth,
} from "./schemas.ts";
import { fetchVia } from "./tls-dispatcher.ts";

export const ROUTES = {
  prefill: "/internal/prefill",
  kvHold: "/internal/kv-hold",
  decode: "/internal/decode",
  generate: "/internal/generate",
  release: "/internal/release",
  tokenize: "/internal/tokenize",
  detokenize: "/internal/detokenize",
  drain: "/internal/drain",
  loraLoad: "/internal/lora/load",
  loraUnload: "/internal/lora/unload",
  health: "/health",
  metrics: "/metrics",
} as const;

export const NDJSON = "application/x-ndjson";

/**
 * Keeps a server's idle keep-alive connections open 65 s (Node's default is 5 s). The peers that
 * call workers and the gateway (undici's fetch in the gateway, Envoy) close an idle connection
 * themselves after a few seconds; a server that closes first races a request being sent on that
 * connection, which then fails with ECONNRESET (seen once as a 502 from the gateway on the k8s rig).
 */
export function keepIdleConnections(server: { keepAliveTimeout: number; headersTimeout: number }): void {
  server.keepAliveTimeout = 65_000;
  server.headersTimeout = 66_000;
}

/** One NDJSON line of an event. */
export function encodeEvent(ev: WorkerEvent): string {
  return `${JSON.stringify(ev)}\n`;
}

/** No event arrived within the idle timeout. */
export class StreamIdleError extends Error {
  constructor(readonly idleMs: number) {
    super(`no event for ${idleMs} ms`);
  }
}

/**
 * Yields each event of a worker's NDJSON `body`. Throws StreamIdleError when no event arrives
 * within `idleMs` (before the first event: within `firstIdleMs`), and ApiError(502,
 * worker_stream_broken) for a line that is not a valid event. Blank lines are the worker's
 * heartbeat while it has nothing to say (they keep the connection's body timeout from firing):
 * skipped, and they do not move the idle deadline.
 */
export async function* readEvents(body: ReadableStream<Uint8Array>, idleMs: number, firstIdleMs = idleMs): AsyncGenerator<WorkerEvent> {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  const parse = (line: string): WorkerEvent => {
    let raw: unknown;
    try {
      raw = JSON.parse(line);
    } catch {
      throw new ApiError(502, "worker_stream_broken", `the worker sent a line that is not JSON: ${line.slice(0, 200)}`);
    }
    const r = WorkerEventSchema.safeParse(raw);
    if (!r.success)
      throw new ApiError(
        502,
        "worker_stream_broken",
        `the worker sent an event outside the contract (${r.error.issues[0].message} at ${r.error.issues[0].path.join(".")}): ${line.slice(0, 200)}`,
      );
    return r.data;
  };
  let seen = false;
  let lastEvent = performance.now();
  try {
    for (;;) {
      let timer: NodeJS.Timeout | undefined;
      const limit = seen ? idleMs : firstIdleMs;
      const waitMs = Math.max(0, limit - (performance.now() - lastEvent));
      const idle = new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new StreamIdleError(limit)), waitMs);
      });
      let chunk: Awaited<ReturnType<typeof reader.read>>;
      try {
        chunk = await Promise.race([reader.read(), idle]);
      } finally {
        clearTimeout(timer);
      }
      if (chunk.done) break;
      buf += decoder.decode(chunk.value, { stream: true });
      let nl = buf.indexOf("\n");
      while (nl >= 0) {
        const line = buf.slice(0, nl).trim();
        buf = buf.slice(nl + 1);
        if (line) {
          seen = true;
          lastEvent = performance.now();
          yield parse(line);
        }
        nl = buf.indexOf("\n");
      }
    }
    const rest = (buf + decoder.decode()).trim();
    if (rest) yield parse(rest);
  } finally {
    reader.cancel().catch(() => {});
  }
}

/**
 * A worker's accepted NDJSON answer (decode, generate). It holds the HTTP response until its
 * events are read: undici cancels the body of a fetch Response that is garbage collected before
 * its body is locked, and a decode answer waits unread while prefill runs (seconds), so handing
 * out only `response.body` let a collection cut the stream to zero events.
 */
export class WorkerEventStream {
  constructor(private readonly response: Response) {}

  /** The events, as readEvents parses them (the response stays referenced while they are read). */
  async *events(idleMs: number, firstIdleMs = idleMs): AsyncGenerator<WorkerEvent> {
    yield* readEvents(this.response.body!, idleMs, firstIdleMs);
  }

  /** The raw NDJSON text (tests). */
  text(): Promise<string> {
    return this.response.text();
  }

  /** Drops the answer without reading it. */
  async cancel(): Promise<void> {
    await this.response.body?.cancel().catch(() => {});
  }
}

export interface CallOptions {
  signal?: AbortSignal;
  /** Extra headers (trace context...). */
  headers?: Record<string, string>;
}

async function bodyOf(r: Response): Promise<unknown> {
  const text = await r.text();
  try {
    return JSON.parse(text);
  } catch {
    return { error: { message: text.slice(0, 500) } };
  }
}

/** A worker's internal API at `url` (e.g. http://127.0.0.1:8101, https://... with TLS). */
export class WorkerClient {
  readonly url: string;
  /** The deployment's internal token header (AIRM_INTERNAL_TOKEN), sent on every call; none without one. */
  private readonly auth: Record<string, string>;
  /** The deployment's TLS material, or none (plain HTTP). */
  private readonly tls: TlsMaterial | undefined;

  /**
   * `options.tls`: the deployment's TLS material (AIRM_TLS_DIR): calls present its certificate and
   * verify the worker's; the URL must then be https. Throws ConfigError for an http URL with TLS.
   */
  constructor(
    url: string,
    /** How this worker is named in error messages ("prefill worker http://..."). */
    readonly who = `worker ${url}`,
    options: { token?: string; tls?: TlsMaterial } = {},
  ) {
    this.url = url.replace(/\/+$/, "");
    this.auth = options.token ? { [INTERNAL_TOKEN_HEADER]: options.token } : {};
    if (options.tls && !/^https:\/\//i.test(this.url)) {
      throw new ConfigError("worker URL", `${this.url}: with AIRM_TLS_DIR set the workers serve TLS only; give https:// URLs`);
    }
    this.tls = options.tls;
  }

  /** The dispatcher of calls over mutual TLS (the current one: it changes when the files reload), or nothing (the global one). */
  private get via(): RequestInit {
    return fetchVia(this.tls);
  }

  private async post(path: string, body: unknown, o: CallOptions): Promise<Response> {
    const r = await fetch(`${this.url}${path}`, {
      method: "POST",
      headers: { "content-type": "application/json", ...o.headers, ...this.auth },
      body: JSON.stringify(body),
      signal: o.signal,
      ...this.via,
    });
    if (r.status === 401) {
      // A deployment fault, not the client's: say so rather than pass a 401 on to whoever called the gateway.
      const why = ApiError.fromBody(401, await bodyOf(r), "unauthorized").code;
      throw new ApiError(502, "worker_refused_internal_token", `${this.who} refused the call (${why}): give every part of the deployment the same AIRM_INTERNAL_TOKEN`);
    }
    if (r.status === 429) {
      const e = ApiError.fromBody(429, await bodyOf(r), `${this.who} is full`);
      throw new OverloadedError(Number(r.headers.get("retry-after")) || 1, e.message);
    }
    if (!r.ok) throw ApiError.fromBody(r.status, await bodyOf(r), `${this.who} answered ${r.status}`);
    return r;
  }

  private async json<T>(
    r: Response,
    schema: { safeParse(v: unknown): { success: true; data: T } | { success: false; error: { issues: { message: string; path: PropertyKey[] }[] } } },
    what: string,
  ): Promise<T> {
    const parsed = schema.safeParse(await bodyOf(r));
    if (!parsed.success) {
      const i = parsed.error.issues[0];
      throw new ApiError(502, "worker_bad_answer", `${this.who} answered ${what} outside the contract: ${i.path.map(String).join(".")}: ${i.message}`);
    }
    return parsed.data;
  }

  /** POST /internal/prefill. Throws ApiError (the worker's error, or a malformed answer) or the fetch error. */
  async prefill(body: PrefillRequest, o: CallOptions = {}): Promise<PrefillResponse> {
    return this.json(await this.post(ROUTES.prefill, PrefillRequestSchema.parse(body), o), PrefillResponseSchema, "the prefill");
  }

  /** POST /internal/kv-hold (decode role): the prompt blocks this worker holds for the request. */
  async kvHold(body: KvHoldRequest, o: CallOptions = {}): Promise<KvHoldResponse> {
    return this.json(await this.post(ROUTES.kvHold, KvHoldRequestSchema.parse(body), o), KvHoldResponseSchema, "the KV hold");
  }

  /** POST /internal/decode: the event stream once the worker accepted the request. */
  async decode(body: DecodeRequest, o: CallOptions = {}): Promise<WorkerEventStream> {
    return new WorkerEventStream(await this.post(ROUTES.decode, DecodeRequestSchema.parse(body), o));
  }

  /** POST /internal/generate (solo): the event stream once the worker accepted the request. */
  async generate(body: GenerateRequest, o: CallOptions = {}): Promise<WorkerEventStream> {
    return new WorkerEventStream(await this.post(ROUTES.generate, GenerateRequestSchema.parse(body), o));
  }

  /** POST /internal/release. */
  async release(body: ReleaseRequest, o: CallOptions = {}): Promise<ReleaseResponse> {
    return this.json(await this.post(ROUTES.release, ReleaseRequestSchema.parse(body), o), ReleaseResponseSchema, "the release");
  }

  /** POST /internal/lora/load: the adapter as the worker loaded it. */
  async loadLora(body: LoraLoadRequest, o: CallOptions = {}): Promise<LoraInfoBody> {
    return this.json(await this.post(ROUTES.loraLoad, LoraLoadRequestSchema.parse(body), o), LoraInfoSchema, "the LoRA load");
  }

  /** POST /internal/lora/unload. */
  async unloadLora(body: LoraUnloadRequest, o: CallOptions = {}): Promise<LoraUnloadResponse> {
    return this.json(await this.post(ROUTES.loraUnload, LoraUnloadRequestSchema.parse(body), o), LoraUnloadResponseSchema, "the LoRA unload");
  }

  /** POST /internal/tokenize. */
  async tokenize(body: TokenizeRequest, o: CallOptions = {}): Promise<TokenizeResponse> {
    return this.json(await this.post(ROUTES.tokenize, TokenizeRequestSchema.parse(body), o), TokenizeResponseSchema, "the tokenization");
  }

  /** POST /internal/detokenize. */
  async detokenize(body: DetokenizeRequest, o: CallOptions = {}): Promise<DetokenizeResponse> {
    return this.json(await this.post(ROUTES.detokenize, DetokenizeRequestSchema.parse(body), o), DetokenizeResponseSchema, "the detokenization");
  }

  /** GET /health: the status and the parsed body (null when it is not a health body). */
  async health(o: CallOptions = {}): Promise<{ status: number; health: WorkerHealth | null }> {
    const r = await fetch(`${this.url}${ROUTES.health}`, { signal: o.signal, headers: { ...o.headers, ...this.auth }, ...this.via });
    const parsed = WorkerHealthSchema.safeParse(await bodyOf(r));
    return { status: r.status, health: parsed.success ? parsed.data : null };
  }
}
