// `helm template` of charts/rngd-pd for the repository's chart tests: the helm binary
// (scripts/tools/helm.sh builds it once), renders with value files and --set pairs, and the
// rendered manifests parsed.
import { execFileSync, spawnSync } from "node:child_process";
import { join } from "node:path";
import { expect } from "vitest";
import { parseAllDocuments } from "yaml";
import { root } from "./source-files.ts";

export const chart = join(root, "charts", "rngd-pd");

/** A rendered manifest, checked field by field. */
export type Manifest = any;

/** The helm binary (built and cached on first use). */
export function helmBinary(): string {
  return execFileSync("bash", [join(root, "scripts", "tools", "helm.sh")], { encoding: "utf8", stdio: ["ignore", "pipe", "inherit"] }).trim();
}

/** `helm template rngd-pd charts/rngd-pd` with these value files and --set pairs. */
export function render(helm: string, files: string[] = [], set: string[] = []): { ok: boolean; out: string; err: string } {
  const args = ["template", "rngd-pd", chart, "--namespace", "serving", ...files.flatMap((f) => ["-f", f]), ...set.flatMap((s) => ["--set", s])];
  const r = spawnSync(helm, args, { encoding: "utf8" });
  return { ok: r.status === 0, out: r.stdout, err: r.stderr };
}

/** The manifests of a render that must succeed. */
export function manifests(helm: string, files: string[] = [], set: string[] = []): Manifest[] {
  const r = render(helm, files, set);
  expect(r.ok, r.err).toBe(true);
  return parseAllDocuments(r.out)
    .map((d) => d.toJS())
    .filter(Boolean);
}
