// What this host's UCX would use for nixl-ucx: library version, the transport/device resources
// a context opens under the current UCX_* environment, the endpoint error mode that follows, and
// the size of a worker address. Creates a short-lived context on the calling thread.

import { readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { UcpWorker, captureStream, ucxVersion } from "./ucp-binding.ts";
import { contextResources, pickErrMode } from "./ucx-resources.ts";

export interface UcxHostInfo {
  version: string;
  /** `transport/device` pairs, e.g. `tcp/eth0`, `posix/memory`, `rc_mlx5/mlx5_0:1`. */
  resources: string[];
  transports: string[];
  devices: string[];
  errMode: "peer" | "none";
  workerAddressBytes: number;
  /** UCX_* variables set in this environment. */
  env: Record<string, string>;
  /** ucp_context_print_info + ucp_worker_print_info, verbatim. */
  raw: string;
}

/**
 * Opens a UCX context and worker like an endpoint would (same features, `tls` or UCX_TLS) and
 * reports what it found; `env` is the environment whose UCX_* variables it reports (UCX reads the
 * process's own). Throws TransportError when libucp is missing or UCX_TLS matches nothing.
 */
export function ucxHostInfo(options: { tls?: string; errMode?: "auto" | "peer" | "none"; env?: Record<string, string | undefined> } = {}): UcxHostInfo {
  const w = new UcpWorker({ tls: options.tls, wakeup: true });
  try {
    const resources = contextResources(w);
    const path = join(tmpdir(), `airm-ucx-info-${process.pid}.txt`);
    let raw = "";
    try {
      captureStream((s) => w.printContextInfo(s), path);
      raw += readFileSync(path, "utf8");
      captureStream((s) => w.printWorkerInfo(s), path);
      raw += readFileSync(path, "utf8");
    } finally {
      rmSync(path, { force: true });
    }
    const env = Object.fromEntries(Object.entries(options.env ?? {}).filter(([k, v]) => k.startsWith("UCX_") && v !== undefined)) as Record<string, string>;
    return {
      version: ucxVersion(),
      resources,
      transports: [...new Set(resources.map((r) => r.split("/")[0]))],
      devices: [...new Set(resources.map((r) => r.split("/")[1]))],
      errMode: pickErrMode(resources, options.errMode ?? "auto") === 1 ? "peer" : "none",
      workerAddressBytes: w.address().byteLength,
      env,
      raw,
    };
  } finally {
    w.destroy();
  }
}
