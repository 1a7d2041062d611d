// A real worker over HTTP for tests that need its server (status codes, headers, metrics): on a
// free port, on a generated 2-layer tiny model, its engine quiet. `close` stops it and removes
// the model folder.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { makeTinyModel } from "@airm/llama";
import pino from "pino";
import { startWorker, type RunningWorker, type WorkerOptions } from "../src/index.ts";

export async function tinyWorker(
  o: Pick<WorkerOptions, "role" | "backend" | "kvTransport" | "host" | "metricsPort"> & { seed: number; env: Record<string, string> },
): Promise<RunningWorker> {
  const root = mkdtempSync(join(tmpdir(), "airm-worker-http-"));
  const model = join(root, "model");
  makeTinyModel({ arch: "llama", out: model, layers: 2, seed: o.seed });
  const w = await startWorker({
    role: o.role,
    backend: o.backend,
    kvTransport: o.kvTransport,
    host: o.host,
    metricsPort: o.metricsPort,
    model,
    port: 0,
    maxModelLen: 64,
    env: { AIRM_ENGINE_LOG: "0", AIRM_ARTIFACT_CACHE: "off", ...o.env },
    logger: pino({ level: "silent" }),
  });
  await w.ready;
  return {
    ...w,
    async close() {
      await w.close();
      rmSync(root, { recursive: true, force: true });
    },
  };
}

/** A solo worker's greedy tokens for a prompt of token ids (POST /internal/generate), the first included. */
export async function generateTokens(w: RunningWorker, requestId: string, promptTokenIds: number[], maxTokens: number): Promise<number[]> {
  const r = await fetch(`${w.url}/internal/generate`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ requestId, input: { promptTokenIds }, maxTokens, ignoreEos: true }),
  });
  const lines = (await r.text())
    .trim()
    .split("\n")
    .map((l) => JSON.parse(l));
  return lines.flatMap((e) => (e.type === "first" || e.type === "token" ? [e.token] : []));
}
