// Workers in-process for route tests (createWorkerApp over a WorkerRuntime, real engines, a real
// shm transport for prefill and decode) and the NDJSON streams they answer. Each test file keeps
// the list of what it opened and closes it.
import { WorkerEventSchema, type WorkerEvent } from "@airm/internal-api";
import { engineForBackend, selectTransport, type KVTransport, type WorkerRole } from "@airm/rm-core";
import pino from "pino";
import { createWorkerApp, loadServingEngine, WorkerRuntime, type ServingEngine } from "../src/index.ts";

export interface Opened {
  engine: ServingEngine;
  transport: KVTransport | null;
}

export interface InProcessOptions {
  model: string;
  env: Record<string, string>;
  maxModelLen: number;
  maxNumSeqs: number;
  /** Where the engine and transport go, for the file's afterAll. */
  opened: Opened[];
  /** The KV budget in blocks (unset: roomy). */
  blocks?: number;
}

const log = pino({ level: "silent" });

export async function inProcessWorker(role: WorkerRole, backend: string, o: InProcessOptions) {
  const rt = new WorkerRuntime({ role, backend, engineName: engineForBackend(backend, role), maxNumSeqs: o.maxNumSeqs, leaseTtlMs: 60_000, kvTimeoutMs: 20_000, log });
  const transport = role === "solo" ? null : await selectTransport({ name: "shm", env: o.env });
  const load = { model: o.model, backend, maxModelLen: o.maxModelLen };
  let options = {};
  if (o.blocks !== undefined) {
    const probe = await loadServingEngine(rt.engineName, load, { env: o.env });
    const bytes = probe.kvCache().blockBytes * o.blocks;
    await probe.close();
    options = { kvCacheMemory: { bytes } };
  }
  const engine = await loadServingEngine(rt.engineName, load, { env: o.env, options });
  o.opened.push({ engine, transport });
  rt.markReady({ engine, transport });
  const app = createWorkerApp(rt);
  const post = (path: string, body: unknown) => app.request(path, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
  return { rt, engine, app, post };
}

/** The events of an NDJSON stream answer. */
export async function events(r: Response): Promise<WorkerEvent[]> {
  return (await r.text())
    .trim()
    .split("\n")
    .map((l) => WorkerEventSchema.parse(JSON.parse(l)));
}

/** The first token (given, or the `first` event's) and the stream's tokens; throws on an error event. */
export function tokensOf(first: number | null, evs: WorkerEvent[]): number[] {
  const f = first ?? (evs.find((e) => e.type === "first") as { token: number }).token;
  const err = evs.find((e) => e.type === "error");
  if (err) throw new Error(`stream failed: ${JSON.stringify(err)}`);
  return [f, ...evs.flatMap((e) => (e.type === "token" ? [e.token] : []))];
}
