// The members of a Kubernetes InferencePool: reads the pool (inference.networking.k8s.io/v1)
// for its selector and target ports, lists the pods it selects, and keeps the serving ones as
// endpoints. It polls (LIST the pool and its pods every pollMs, 1 s by default) instead of
// watching: a poll survives API restarts, expired resource versions and selector changes with
// no extra code, and one LIST of a few pods per second is cheap. A failed poll keeps the last
// members; a pool that was deleted empties them. The endpoint picker uses it as its endpoint
// source; the gateway uses it to check that a host named in a header belongs to the pool.

import type { CoreV1Api, CustomObjectsApi, KubeConfig } from "@kubernetes/client-node";
import { AirmError } from "@airm/rm-core";
import { ChangeListeners, sameEndpoints, type EndpointSource } from "./endpoint-source.ts";
import { hostPortOf, type Endpoint, type Role } from "./endpoint.ts";
import { silentLog, type Log } from "./log.ts";
import { INFERENCE_POOL, labelSelectorText, podEndpoints, poolSpecOf, type PodLike, type PoolSpec } from "./pod-endpoints.ts";

/** What the watcher asks the API server (the real one is kubeApi(); tests pass their own). */
export interface PoolApi {
  /** The pool object, or null when it does not exist. */
  readPool(namespace: string, name: string): Promise<unknown | null>;
  listPods(namespace: string, labelSelector: string): Promise<PodLike[]>;
}

/** The pool could not be read in time at start (missing, no permission, API unreachable). */
export class PoolUnavailableError extends AirmError {
  constructor(namespace: string, name: string, cause: string) {
    super(
      "CONFIG",
      `InferencePool ${namespace}/${name} could not be read: ${cause}. Check --pool-name/--pool-namespace, that the InferencePool CRD (inference.networking.k8s.io/v1) is installed, and that this service account may get inferencepools and list pods there`,
    );
  }
}

/**
 * The PoolApi of a real API server, from a KubeConfig (default: KUBECONFIG, ~/.kube/config, or
 * in-cluster). @kubernetes/client-node is imported on the first call (it takes seconds to load),
 * so importing this module stays cheap.
 */
export function kubeApi(kc?: KubeConfig): PoolApi {
  let clients: Promise<{ custom: CustomObjectsApi; core: CoreV1Api }> | undefined;
  const load = () =>
    (clients ??= import("@kubernetes/client-node").then((k) => {
      const config = kc ?? new k.KubeConfig();
      if (!kc) config.loadFromDefault();
      return { custom: config.makeApiClient(k.CustomObjectsApi), core: config.makeApiClient(k.CoreV1Api) };
    }));
  return {
    async readPool(namespace, name) {
      const { custom } = await load();
      try {
        return await custom.getNamespacedCustomObject({ group: INFERENCE_POOL.group, version: INFERENCE_POOL.version, plural: INFERENCE_POOL.plural, namespace, name });
      } catch (e) {
        if ((e as { code?: number }).code === 404) return null;
        throw e;
      }
    },
    async listPods(namespace, labelSelector) {
      const { core } = await load();
      return (await core.listNamespacedPod({ namespace, labelSelector })).items as PodLike[];
    },
  };
}

export interface PoolMembersOptions {
  poolName: string;
  namespace: string;
  /** How to reach the API server (default: kubeApi() with the default KubeConfig). */
  api?: PoolApi;
  /** Poll period in ms (default 1000). */
  pollMs?: number;
  /** How long start() retries before it gives up, in ms (default 30 000). */
  startTimeoutMs?: number;
  log?: Log;
}

export class InferencePoolMembers implements EndpointSource {
  readonly poolName: string;
  readonly namespace: string;
  private readonly api: PoolApi;
  private readonly pollMs: number;
  private readonly startTimeoutMs: number;
  private readonly log: Log;
  private readonly listeners = new ChangeListeners();
  private current: Endpoint[] = [];
  private spec: PoolSpec | null = null;
  private timer: NodeJS.Timeout | undefined;
  private stopped = false;
  private lastError = "";

  constructor(options: PoolMembersOptions) {
    this.poolName = options.poolName;
    this.namespace = options.namespace;
    this.api = options.api ?? kubeApi();
    this.pollMs = options.pollMs ?? 1000;
    this.startTimeoutMs = options.startTimeoutMs ?? 30_000;
    this.log = options.log ?? silentLog;
  }

  /** Resolves after the first successful read; retries every pollMs, then throws PoolUnavailableError. */
  async start(): Promise<void> {
    this.stopped = false;
    const deadline = Date.now() + this.startTimeoutMs;
    for (;;) {
      try {
        await this.poll();
        break;
      } catch (e) {
        if (this.stopped || Date.now() + this.pollMs > deadline) throw new PoolUnavailableError(this.namespace, this.poolName, (e as Error).message);
        await new Promise((r) => setTimeout(r, this.pollMs));
      }
    }
    this.schedule();
  }

  stop(): void {
    this.stopped = true;
    clearTimeout(this.timer);
    this.timer = undefined;
  }

  /** The serving members now (one per pod and target port). */
  endpoints(): Endpoint[] {
    return [...this.current];
  }

  /** The pool's selector and target ports as last read (null before the first read or once deleted). */
  poolSpec(): PoolSpec | null {
    return this.spec;
  }

  /**
   * True when "ip:port" is a serving member, and of one of `role` when given ("both" members count
   * for either half when `role` is "prefill" or "decode").
   */
  has(hostPort: string, role?: Role | Role[]): boolean {
    const roles = role === undefined ? null : Array.isArray(role) ? role : [role];
    return this.current.some((e) => hostPortOf(e) === hostPort && (roles === null || roles.includes(e.role) || e.role === "both"));
  }

  onChange(listener: (endpoints: Endpoint[]) => void): () => void {
    return this.listeners.add(listener);
  }

  private schedule(): void {
    if (this.stopped) return;
    this.timer = setTimeout(async () => {
      try {
        await this.poll();
        this.lastError = "";
      } catch (e) {
        const msg = (e as Error).message;
        if (msg !== this.lastError) this.log.warn({ pool: `${this.namespace}/${this.poolName}`, err: msg }, "pool poll failed; keeping the last members");
        this.lastError = msg;
      }
      this.schedule();
    }, this.pollMs);
    this.timer.unref();
  }

  /** One read of the pool and its pods. Throws when the API fails or the pool is malformed. */
  private async poll(): Promise<void> {
    const pool = await this.api.readPool(this.namespace, this.poolName);
    if (this.stopped) return;
    if (pool === null) {
      if (this.spec === null && this.current.length === 0) throw new Error("not found");
      this.spec = null;
      this.update([]);
      return;
    }
    const spec = poolSpecOf(pool);
    const pods = await this.api.listPods(this.namespace, labelSelectorText(spec.selector));
    if (this.stopped) return;
    this.spec = spec;
    this.update(pods.flatMap((p) => podEndpoints(p, spec.targetPorts)));
  }

  private update(next: Endpoint[]): void {
    if (sameEndpoints(next, this.current)) return;
    this.current = next;
    this.log.info({ pool: `${this.namespace}/${this.poolName}`, endpoints: next.map((e) => `${e.name}=${hostPortOf(e)}/${e.role}`) }, "pool members changed");
    this.listeners.emit(next);
  }
}
