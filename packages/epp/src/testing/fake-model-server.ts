// A stand-in for a model server's /metrics: a node:http server on 127.0.0.1 (port 0) that
// answers with vLLM's three load gauges, whose values a test sets, or with an error status. Given
// TLS material it is an HTTPS server with mutual TLS, as a worker with AIRM_TLS_DIR is.

import { createServer, type RequestListener, type Server } from "node:http";
import { createServer as createHttpsServer } from "node:https";
import { serverTlsOptions, type TlsMaterial } from "@airm/rm-core";
import type { AddressInfo } from "node:net";
import type { Endpoint, Role } from "@airm/routing";
import type { ServerLoad } from "../prometheus-text.ts";

export interface FakeModelServer {
  readonly port: number;
  /** This server as an endpoint of `role`. */
  endpoint(role: Role, name?: string): Endpoint;
  /** Changes the load the next scrape sees. */
  setLoad(load: Partial<ServerLoad>): void;
  /** Answers /metrics with this HTTP status from now on (200 again to recover). */
  setStatus(status: number): void;
  /** Scrapes answered so far. */
  readonly scrapes: number;
  close(): Promise<void>;
}

/** The /metrics text of a load (with HELP/TYPE lines and a second label set of waiting, as a real page has). */
export function metricsText(load: ServerLoad): string {
  return [
    "# HELP vllm:num_requests_waiting requests waiting",
    "# TYPE vllm:num_requests_waiting gauge",
    `vllm:num_requests_waiting{model_name="m",engine="0"} ${load.waiting}`,
    `vllm:num_requests_waiting{model_name="m",engine="1"} 0`,
    "# TYPE vllm:num_requests_running gauge",
    `vllm:num_requests_running{model_name="m"} ${load.running}`,
    "# TYPE vllm:kv_cache_usage_perc gauge",
    `vllm:kv_cache_usage_perc{model_name="m"} ${load.kvUsage}`,
    "",
  ].join("\n");
}

export async function startFakeModelServer(initial: Partial<ServerLoad> = {}, tls?: TlsMaterial): Promise<FakeModelServer> {
  let load: ServerLoad = { waiting: 0, running: 0, kvUsage: 0, ...initial };
  let status = 200;
  let scrapes = 0;
  const answer: RequestListener = (req, res) => {
    if (req.url !== "/metrics") return void res.writeHead(404).end();
    scrapes++;
    if (status !== 200) return void res.writeHead(status).end("down\n");
    res.writeHead(200, { "content-type": "text/plain; version=0.0.4" }).end(metricsText(load));
  };
  const server: Server = tls ? createHttpsServer(serverTlsOptions(tls), answer) : createServer(answer);
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", () => resolve()));
  const port = (server.address() as AddressInfo).port;
  return {
    port,
    endpoint: (role, name) => ({ address: "127.0.0.1", port, role, name: name ?? `pod-${port}` }),
    setLoad: (l) => {
      load = { ...load, ...l };
    },
    setStatus: (s) => {
      status = s;
    },
    get scrapes() {
      return scrapes;
    },
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}
