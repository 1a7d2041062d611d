// The LoRA adapters loaded through this gateway at run time (POST /v1/load_lora_adapter), by name
// and path. A worker keeps them in memory only, so one that restarts (a crash, an OOM kill, a new
// pod) comes back without them; the gateway's pools give them to it again before it is picked
// (endpoint-pool.ts), so a request naming an adapter never reaches a worker that lacks it.

import type { WorkerHealth } from "@airm/internal-api";

export interface RuntimeAdapter {
  name: string;
  path: string;
}

export class RuntimeAdapters {
  private readonly byName = new Map<string, string>();

  /** An adapter every worker loaded (the load route's all-or-none succeeded). */
  add(a: RuntimeAdapter): void {
    this.byName.set(a.name, a.path);
  }

  /** An adapter unloaded through the gateway: no longer given to workers. */
  remove(name: string): void {
    this.byName.delete(name);
  }

  /** The adapters a worker whose /health is `health` does not list (all of them when it lists none). */
  missingOn(health: WorkerHealth | null): RuntimeAdapter[] {
    if (this.byName.size === 0) return [];
    const has = new Set((health?.lora?.adapters ?? []).map((a) => a.name));
    return [...this.byName].filter(([name]) => !has.has(name)).map(([name, path]) => ({ name, path }));
  }
}
