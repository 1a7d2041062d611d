// The contract between the picker and whatever knows the pool's members: a static file on a
// laptop (static-endpoints.ts) or an InferencePool's pods in Kubernetes (pool-members.ts).

import type { Endpoint } from "./endpoint.ts";

export interface EndpointSource {
  /** Reads the members once; resolves when they are known. Throws when they cannot be read at all. */
  start(): Promise<void>;
  /** Stops watching; endpoints() keeps its last answer. */
  stop(): void;
  /** The current members (a fresh array each call; callers may keep it). */
  endpoints(): Endpoint[];
  /** Calls `listener` with the new members after each change; returns the unsubscribe function. */
  onChange(listener: (endpoints: Endpoint[]) => void): () => void;
}

/** Two member lists are the same set (order aside). */
export function sameEndpoints(a: Endpoint[], b: Endpoint[]): boolean {
  if (a.length !== b.length) return false;
  const key = (e: Endpoint) => `${e.address}\0${e.port}\0${e.role}\0${e.name}\0${e.kvEvents ?? ""}\0${e.kvReplay ?? ""}`;
  const seen = new Set(a.map(key));
  return b.every((e) => seen.has(key(e)));
}

/** The listener set every source uses. */
export class ChangeListeners {
  private readonly listeners = new Set<(endpoints: Endpoint[]) => void>();

  add(listener: (endpoints: Endpoint[]) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  emit(endpoints: Endpoint[]): void {
    for (const l of this.listeners) l([...endpoints]);
  }
}
