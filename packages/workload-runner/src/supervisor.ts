// Keeps a local cluster's processes: starts each part from its spec, and decides what a part's
// death does. "restart": it is started again after a backoff (doubling per recent death, capped)
// and announced once its readiness probe answers, until it dies `maxDeaths` times within the
// window, which stops everything. "stop-all": any death stops everything. "keep": nothing (tests
// that kill parts on purpose). Deaths before the cluster is up are left to the start-up loop.

import { RM_CORE_CONFIG } from "@airm/rm-core";
import { ChildPart, type PartSpec } from "./child-part.ts";

export interface RestartPolicy {
  /** Wait before the first restart (ms); doubles with each death inside the window. */
  firstDelayMs: number;
  /** Longest wait between restarts (ms). */
  maxDelayMs: number;
  /** Deaths of one part within `windowMs` that make the launcher give up and stop the cluster. */
  maxDeaths: number;
  windowMs: number;
}

export const RESTART_POLICY: RestartPolicy = { firstDelayMs: 500, maxDelayMs: 10_000, maxDeaths: 5, windowMs: 60_000 };

export type OnPartExit = "restart" | "stop-all" | "keep";

export interface SupervisorOptions {
  specs: PartSpec[];
  env: Record<string, string | undefined>;
  onPartExit: OnPartExit;
  policy: RestartPolicy;
  log(line: string): void;
  childLog(part: string, line: string): void;
  /** True once `p` answers its readiness probe. */
  probe(p: ChildPart): Promise<boolean>;
  /** Called after everything stopped (removes the cluster's folder). */
  afterStop(): void;
  /** Told each time a part's process is started, the first time and at each restart. */
  onLaunch?(name: string): void;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** A part's last output lines, indented with its name, for a death report. */
function lastWords(p: ChildPart): string {
  const tail = p
    .logs(12)
    .split("\n")
    .filter(Boolean)
    .map((l) => `  ${p.name}| ${l}`)
    .join("\n");
  return tail ? `\nits last output:\n${tail}` : "";
}

export class Supervisor {
  /** The current process of each part, in spec order (a restart replaces its entry). */
  readonly parts: ChildPart[] = [];
  /** Resolves with the exit code once the cluster stopped (asked: 0, a part died: 1). */
  readonly done: Promise<number>;
  private resolveDone!: (code: number) => void;
  private stopping = false;
  private up = false;
  private readonly deaths = new Map<string, number[]>();

  constructor(private readonly o: SupervisorOptions) {
    this.done = new Promise((r) => (this.resolveDone = r));
    for (let i = 0; i < o.specs.length; i++) this.launch(i);
  }

  get isStopping(): boolean {
    return this.stopping;
  }

  /** The cluster is up: deaths from now on follow onPartExit. */
  markUp(): void {
    this.up = true;
  }

  /** Stops every part (last started first) and cleans up; `code` resolves `done`. */
  async stop(reason?: string, code = 0): Promise<void> {
    if (this.stopping) return;
    this.stopping = true;
    if (reason) this.o.log(reason);
    // The gateway first: it drains (takes nothing new; the streams it holds finish while the
    // workers still serve them). Then the workers, which drain too (a request that reached one
    // late finishes), then the sidecars. Each draining part gets AIRM_DRAIN_S plus 5 s.
    const drainMs = (p: ChildPart) => 1000 * RM_CORE_CONFIG.resolve({ env: { ...this.o.env, ...p.spec.env } }).drainS + 5000;
    for (const stage of ["front", "worker"] as const) {
      await Promise.all(this.parts.filter((p) => p.spec.drains === stage).map((p) => p.stop("SIGTERM", drainMs(p))));
    }
    await Promise.all([...this.parts].reverse().map((p) => p.stop()));
    this.o.afterStop();
    this.resolveDone(code);
  }

  private launch(i: number): ChildPart {
    const p = new ChildPart(this.o.specs[i], this.o.env, this.o.childLog);
    this.parts[i] = p;
    this.o.onLaunch?.(p.name);
    void p.exited.then(() => this.onDeath(i, p));
    return p;
  }

  private async onDeath(i: number, p: ChildPart): Promise<void> {
    if (this.stopping || !this.up || this.o.onPartExit === "keep") return;
    if (this.o.onPartExit === "stop-all") return this.stop(`airm up: the ${p.name} ${p.howItEnded}; stopping the cluster.${lastWords(p)}`, 1);
    const { firstDelayMs, maxDelayMs, maxDeaths, windowMs } = this.o.policy;
    const now = Date.now();
    const recent = [...(this.deaths.get(p.name) ?? []), now].filter((t) => now - t < windowMs);
    this.deaths.set(p.name, recent);
    const within = `within ${windowMs / 1000} s`;
    if (recent.length >= maxDeaths) {
      return this.stop(`airm up: the ${p.name} ${p.howItEnded} (${recent.length} deaths ${within}); giving up and stopping the cluster.${lastWords(p)}`, 1);
    }
    const delay = Math.min(firstDelayMs * 2 ** (recent.length - 1), maxDelayMs);
    this.o.log(`airm up: the ${p.name} ${p.howItEnded}; restarting it in ${delay} ms (death ${recent.length} of ${maxDeaths} allowed ${within}).${lastWords(p)}`);
    await sleep(delay);
    if (this.stopping) return;
    const next = this.launch(i);
    // Announce it once it answers its probe (the gateway routes to it again from then on).
    while (next.alive && !this.stopping && this.parts[i] === next) {
      if (await this.o.probe(next).catch(() => false)) return this.o.log(`airm up: ${next.name} is healthy again`);
      await sleep(100);
    }
  }
}
