// deploy/k8s: `airm k8s gen-sweep` writes the committed sweep-matrix.yaml (a test keeps it current),
// every document is a Deployment that holds a card per pod and starts scaled to zero, and
// `airm k8s render` fills in the site from the shell or the env file, or refuses naming what is
// missing. The rendered sweep is also validated by a real kube-apiserver in test/k8s.
import { execFileSync, spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { expect, test } from "vitest";
import { parseAllDocuments } from "yaml";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const airm = join(root, "packages", "workload-runner", "bin", "airm.mjs");
const matrix = join(root, "deploy", "k8s", "sweep-matrix.yaml");
const run = (args: string[], env: Record<string, string> = {}) =>
  spawnSync(process.execPath, [airm, "k8s", ...args], { encoding: "utf8", env: { PATH: process.env.PATH ?? "", HOME: process.env.HOME ?? "", ...env } });

test("gen-sweep writes the committed matrix: one Deployment per transport x decode x batch, Recreate, replicas 0, pinned to the RNGD_PD_NODE placeholder", () => {
  const out = run(["gen-sweep"]);
  expect(out.status, out.stderr).toBe(0);
  expect(out.stdout, "deploy/k8s/sweep-matrix.yaml is stale: pnpm exec airm k8s gen-sweep > deploy/k8s/sweep-matrix.yaml").toBe(readFileSync(matrix, "utf8"));
  const docs = parseAllDocuments(out.stdout).map((d) => d.toJS() as any);
  expect(docs.map((d) => d.metadata.name)).toEqual(["shm", "tcp"].flatMap((kv) => ["atom", "rngd"].flatMap((dec) => [4, 8].map((b) => `rngd-pd-sweep-${kv}-${dec}-b${b}`))));
  for (const d of docs) {
    expect(d).toMatchObject({ kind: "Deployment", spec: { replicas: 0, strategy: { type: "Recreate" }, template: { spec: { nodeName: `\${RNGD_PD_NODE}` } } } });
    const cs = d.spec.template.spec.containers;
    const decode = cs.find((c: any) => c.name === "decode");
    const backend = decode.args[decode.args.indexOf("--backend") + 1];
    expect(Object.keys(decode.resources.limits)).toEqual([backend === "atom" ? "rebellions.ai/ATOM" : "furiosa.ai/rngd"]);
    expect(cs.some((c: any) => c.name === "kv-relay")).toBe(d.metadata.name.includes("-tcp-"));
  }
});

test("render fills in the node and home from the env file, the shell wins, and a missing one is an error naming it", () => {
  const dir = mkdtempSync(join(tmpdir(), "airm-sweep-"));
  const site = join(dir, "cluster.local.env");
  writeFileSync(site, "# site\nRNGD_PD_NODE=npu-node-3\nexport RNGD_PD_HOME='/home/lab'\n");
  const a = run(["render", matrix, "--site-env", site]);
  expect(a.status, a.stderr).toBe(0);
  expect(a.stdout).not.toContain("$" + "{");
  expect(a.stdout).toContain("nodeName: npu-node-3");
  expect(a.stdout).toContain("path: /home/lab/rngd-pd");
  expect(run(["render", matrix, "--site-env", site], { RNGD_PD_NODE: "from-shell" }).stdout).toContain("nodeName: from-shell");
  const missing = run(["render", matrix, "--site-env", join(dir, "absent.env")]);
  expect(missing.status).toBe(2);
  expect(missing.stdout).toBe("");
  expect(missing.stderr).toContain("RNGD_PD_NODE and RNGD_PD_HOME not set");
  const half = run(["render", matrix, "--site-env", join(dir, "absent.env")], { RNGD_PD_HOME: "/h" });
  expect(half.stderr).toMatch(/RNGD_PD_NODE not set/);
  expect(execFileSync(process.execPath, [airm, "k8s", "--help"], { encoding: "utf8" })).toContain("RNGD_PD_NODE");
}, 60_000); // six CLI runs of about a second each on an idle 2-core machine
