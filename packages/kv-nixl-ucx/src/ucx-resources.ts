// Which UCX resources (transport/device pairs) a context opened, read from ucp_context_print_info,
// and the endpoint error-handling mode that follows from them.

import { readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { UCP_ERR_HANDLING_MODE_NONE, UCP_ERR_HANDLING_MODE_PEER, captureStream, type UcpWorker } from "./ucp-binding.ts";

const SHARED_MEMORY_TRANSPORTS = new Set(["sysv", "posix", "cma", "knem", "xpmem"]);

/** The resources (`tcp/lo`, `posix/memory`, ...) a context would use, from ucp_context_print_info. */
export function contextResources(w: UcpWorker): string[] {
  const path = join(tmpdir(), `airm-ucx-info-${process.pid}-${Math.random().toString(36).slice(2)}.txt`);
  try {
    captureStream((s) => w.printContextInfo(s), path);
    const text = readFileSync(path, "utf8");
    return [...text.matchAll(/resource\s+\d+\s*:.*?\s(\S+\/\S+)\s*$/gm)].map((m) => m[1]);
  } finally {
    rmSync(path, { force: true });
  }
}

/** PEER error handling unless a shared-memory transport is enabled (UCX 1.13 shm has no peer-failure support). */
export function pickErrMode(resources: string[], requested: "auto" | "peer" | "none"): number {
  if (requested === "peer") return UCP_ERR_HANDLING_MODE_PEER;
  if (requested === "none") return UCP_ERR_HANDLING_MODE_NONE;
  const shm = resources.some((r) => SHARED_MEMORY_TRANSPORTS.has(r.split("/")[0]));
  return shm ? UCP_ERR_HANDLING_MODE_NONE : UCP_ERR_HANDLING_MODE_PEER;
}
