// Containers and volumes for the container tests (test/containers.test.ts), run with podman and
// scripts/image/containers.conf under names that start with a tag of the run. They run detached
// (podman run -d, under conmon), outside the test process's tree: nothing else stops them, so
// removeAll() removes every one made, and also runs if a signal stops the test process
// (scripts/rig-cleanup.ts).
import { spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import { onInterrupt } from "../scripts/rig-cleanup.ts";

export const podmanEnv = { ...process.env, CONTAINERS_CONF: fileURLToPath(new URL("../scripts/image/containers.conf", import.meta.url)) };

/** Runs podman; returns stdout (and stderr with `allowFail`). Throws with stderr on failure unless `allowFail`. */
export function podman(args: string[], opts: { allowFail?: boolean } = {}): string {
  const r = spawnSync("podman", args, { encoding: "utf8", env: podmanEnv, timeout: 120_000 });
  if (r.status !== 0 && !opts.allowFail) throw new Error(`podman ${args.join(" ")}: ${r.stderr || r.stdout}`);
  return `${r.stdout ?? ""}${opts.allowFail ? (r.stderr ?? "") : ""}`;
}

export class PodmanRun {
  private readonly containers: string[] = [];
  private readonly volumes: string[] = [];
  private forget: (() => void) | undefined;

  constructor(readonly tag: string) {}

  /** Starts `image` detached as `<tag>-<name>` with `flags` (podman run's) and `args`; returns its name. */
  run(name: string, flags: string[], image: string, args: string[]): string {
    const full = this.track(this.containers, name);
    podman(["run", "-d", "--name", full, ...flags, image, ...args]);
    return full;
  }

  /** Creates volume `<tag>-<name>` with `flags` (podman volume create's); returns its name. */
  volume(name: string, flags: string[] = []): string {
    const full = this.track(this.volumes, name);
    podman(["volume", "create", ...flags, full]);
    return full;
  }

  /** Removes every container (at once: no grace period) and volume made. */
  removeAll(): void {
    for (const c of this.containers.splice(0)) podman(["rm", "-f", "-t", "0", c], { allowFail: true });
    for (const v of this.volumes.splice(0)) podman(["volume", "rm", "-f", v], { allowFail: true });
    this.forget?.();
    this.forget = undefined;
  }

  /** Names `name` and records it (before podman makes it: a signal meanwhile still removes it). */
  private track(list: string[], name: string): string {
    this.forget ??= onInterrupt(() => this.removeAll());
    const full = `${this.tag}-${name}`;
    list.push(full);
    return full;
  }
}
