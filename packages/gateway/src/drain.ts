// The gateway's drain. Told to stop (SIGTERM, SIGINT, a pod deleted by a rolling update), the
// gateway reports not ready (/health 503, status draining), so Envoy, an endpoint picker or a
// Service stops sending it requests; a request that still reaches it gets 503 gateway_draining
// with Retry-After and its connection closed, so the client's retry opens a connection that can
// reach another replica. The requests it already holds finish (their streams go on to the end)
// for up to the grace period (AIRM_DRAIN_S); what is still open then ends with an error event
// gateway_draining instead of a cut connection. Only then does the gateway close its listener.

import type { Server } from "node:http";
import { ApiError } from "@airm/internal-api";
import type { MiddlewareHandler } from "hono";

/** Routes that keep answering while the gateway drains: probes and scrapes see it go. */
const PROBES = new Set(["/health", "/metrics"]);

/** Seconds a refused client is told to wait before it retries (Retry-After). */
export const DRAIN_RETRY_AFTER_S = 1;

export class GatewayDrain {
  /** Set once the drain began: new requests are refused and /health says draining. */
  draining = false;
  private open = 0;
  private readonly cutOff = new AbortController();

  /** Aborted when the grace period ends with requests still open: they end with gateway_draining. */
  get signal(): AbortSignal {
    return this.cutOff.signal;
  }

  /** Requests whose answer (or stream) has not ended yet. */
  get openRequests(): number {
    return this.open;
  }

  /** The error a request still open at the end of the grace period ends with. */
  static cutError(): ApiError {
    return new ApiError(503, "gateway_draining", "the gateway was stopped and its drain period (AIRM_DRAIN_S) ran out before this answer ended; send the request again");
  }

  /**
   * The middleware: refuses requests while draining (probes excepted), counts every other request
   * until its answer's body has been sent (a stream until its last event), and closes a draining
   * gateway's connections after each answer.
   */
  middleware(): MiddlewareHandler {
    return async (c, next) => {
      if (PROBES.has(c.req.path)) {
        await next();
        if (this.draining) c.header("connection", "close");
        return;
      }
      if (this.draining) {
        return new ApiError(
          503,
          "gateway_draining",
          `this gateway is shutting down and takes no new requests; retry in ${DRAIN_RETRY_AFTER_S} s (another replica will answer)`,
        ).toResponse({ "retry-after": String(DRAIN_RETRY_AFTER_S), connection: "close" });
      }
      const done = this.enter();
      try {
        await next();
      } catch (err) {
        done();
        throw err;
      }
      if (this.draining) c.header("connection", "close");
      c.res = untilBodyEnds(c.res, done);
    };
  }

  /**
   * Drains: no new requests, then waits (closing connections as they go idle) until the open
   * requests have ended or `graceMs` passed, then cuts what is left with gateway_draining and gives
   * those up to 2 s to end. Resolves with the number of requests cut.
   */
  async run(server: Server, graceMs: number): Promise<number> {
    this.draining = true;
    server.closeIdleConnections?.();
    await this.whileOpen(server, graceMs);
    const cut = this.open;
    if (cut > 0) {
      this.cutOff.abort(GatewayDrain.cutError());
      await this.whileOpen(server, 2000);
    }
    return cut;
  }

  private async whileOpen(server: Server, ms: number): Promise<void> {
    const end = performance.now() + ms;
    while (this.open > 0 && performance.now() < end) {
      await new Promise((r) => setTimeout(r, 50));
      // A connection whose answer ended while draining is idle now: close it too.
      server.closeIdleConnections?.();
    }
  }

  /** Counts one request in; the function returned counts it out (once, however often it is called). */
  private enter(): () => void {
    this.open++;
    let out = false;
    return () => {
      if (out) return;
      out = true;
      this.open--;
    };
  }
}

/** `res` with `done` called once its body has been read to the end, failed or been cancelled. */
function untilBodyEnds(res: Response, done: () => void): Response {
  if (!res.body) {
    done();
    return res;
  }
  const reader = res.body.getReader();
  const body = new ReadableStream<Uint8Array>({
    async pull(ctl) {
      try {
        const chunk = await reader.read();
        if (chunk.done) {
          done();
          ctl.close();
        } else ctl.enqueue(chunk.value);
      } catch (err) {
        done();
        ctl.error(err);
      }
    },
    cancel(reason) {
      done();
      return reader.cancel(reason);
    },
  });
  return new Response(body, { status: res.status, statusText: res.statusText, headers: res.headers });
}
