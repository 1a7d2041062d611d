// The chart on a REAL node: containerd 2 + kubelet 1.36 (scripts/k8s-rig/node.ts) joined to the
// rig's control plane beside a kwok `cpu` node, labelled and given the extended resources of a
// node holding both cards. `helm install` with default values (shm: one PD pod = prefill, decode
// and gateway containers sharing a memory-backed emptyDir) and the project image imported into
// containerd. Checks: the PD pod lands on the real node and is Ready through the kubelet's own
// readiness probes (the pod runner leaves it alone); a completion through the pod IP gives the
// tokens `airm up`'s launcher gives; the containers' uid, capabilities and read-only root as the
// kernel sees them; the KV emptyDir is one tmpfs seen by both workers; each container's cgroup
// memory after the completion against the chart's requests and limits; the pod's start time; and
// after `helm uninstall` no task, container, sandbox or mount of the pod. Run by test-node.sh.
import { execFileSync } from "node:child_process";
import { chmodSync, existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { makeTinyModel } from "../../packages/llama/src/index.ts";
import { type RunningCluster, startLocalCluster } from "../../packages/workload-runner/src/index.ts";
import { type RealNode, startNode } from "../../scripts/k8s-rig/node.ts";
import { PodRunner } from "../../scripts/k8s-rig/pod-runner.ts";
import { chartCompletion, helm as runHelm } from "../../scripts/k8s-rig/release.ts";
import { type Rig, startRig } from "../../scripts/k8s-rig/rig.ts";

const repo = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const chart = join(repo, "charts", "rngd-pd");
const NS = "serving";
const NODE = "npu-both-real";
const RNGD = "airm.ai-computing.io/furiosa.RNGD";
const ATOM = "airm.ai-computing.io/rebellions.ATOM";
const IMAGE = process.env.RIG_NODE_IMAGE ?? "";
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const t0 = Date.now();
const log = (s: string) => console.log(`[${((Date.now() - t0) / 1000).toFixed(1)}s] ${s}`);

let rig: Rig;
let node: RealNode;
let runner: PodRunner;
let helm: string;
let modelDir: string;
let reference: RunningCluster;

type Obj = any;

async function until<T>(what: string, f: () => T | null | undefined | false | Promise<T | null | undefined | false>, ms: number, every = 250): Promise<T> {
  const end = Date.now() + ms;
  for (;;) {
    const v = await f();
    if (v) return v;
    if (Date.now() > end) throw new Error(`not within ${ms} ms: ${what}\n${state()}`);
    await sleep(every);
  }
}

function state(): string {
  const safe = (f: () => string) => {
    try {
      return f();
    } catch (e) {
      return (e as Error).message;
    }
  };
  return [
    safe(() => rig.kubectl(["get", "pods", "-A", "-o", "wide"])),
    safe(() => rig.kubectl(["get", "events", "-A", "--sort-by=.lastTimestamp"]).split("\n").slice(-25).join("\n")),
    safe(() => readFileSync(join(node.dir, "kubelet.log"), "utf8").split("\n").slice(-25).join("\n")),
  ].join("\n---\n");
}

const helmRun = (args: string[]) => runHelm(helm, [...args, "--kubeconfig", rig.kubeconfig, "--namespace", NS]);
const pdPods = (): Obj[] =>
  JSON.parse(rig.kubectl(["get", "pods", "-n", NS, "-l", "app.kubernetes.io/component=pd", "-o", "json"])).items.filter((p: Obj) => !p.metadata.deletionTimestamp);

const completion = chartCompletion;

/** container id -> host pid of its task (`ctr task ls`: TASK PID STATUS). */
function taskPids(): Map<string, number> {
  const rows = node.ctr(["task", "ls"]).trim().split("\n").slice(1);
  return new Map(rows.map((l) => l.trim().split(/\s+/)).map(([id, pid]) => [id!, Number(pid)]));
}

/** The fields of /proc/<pid>/status this test reads. */
function procStatus(pid: number): Record<string, string> {
  const out: Record<string, string> = {};
  for (const l of readFileSync(`/proc/${pid}/status`, "utf8").split("\n")) {
    const m = /^(Uid|Gid|CapEff|CapPrm|CapBnd|NoNewPrivs):\s+(.*)$/.exec(l);
    if (m) out[m[1]!] = m[2]!.trim();
  }
  return out;
}

/** /proc/<pid>/mountinfo as { mountPoint, device, options, fsType }. */
function mounts(pid: number): { at: string; dev: string; opts: string; fs: string; super: string }[] {
  return readFileSync(`/proc/${pid}/mountinfo`, "utf8")
    .trim()
    .split("\n")
    .map((l) => {
      const [pre, post] = l.split(" - ");
      const f = pre!.split(" ");
      const g = post!.split(" ");
      return { at: f[4]!, dev: f[2]!, opts: f[5]!, fs: g[0]!, super: g[2] ?? "" };
    });
}

const mib = (b: number) => `${(b / 1024 / 1024).toFixed(1)} MiB`;

beforeAll(async () => {
  if (!IMAGE) throw new Error("RIG_NODE_IMAGE is not set: run scripts/k8s-rig/test-node.sh");
  helm = execFileSync("bash", [join(repo, "scripts", "tools", "helm.sh")], { encoding: "utf8", stdio: ["ignore", "pipe", "inherit"] }).trim();
  // The model on the node's disk, mounted by model.hostPath at /models (model.path /models/model).
  modelDir = mkdtempSync(join(tmpdir(), "airm-node-model-"));
  chmodSync(modelDir, 0o755);
  makeTinyModel({ arch: "llama", out: join(modelDir, "model") });
  reference = await startLocalCluster({ model: join(modelDir, "model"), maxModelLen: 128, port: 0, prefill: [{ port: 0 }], decode: [{ port: 0 }] });
  let s = Date.now();
  rig = await startRig([{ name: "cpu", labels: {} }]);
  log(`rig (1 kwok node) up in ${Date.now() - s} ms`);
  s = Date.now();
  node = await startNode(rig, {
    name: NODE,
    labels: { [RNGD]: "true", [ATOM]: "true" },
    // Tainted as card nodes often are: only pods that tolerate it land there.
    taints: [{ key: "airm.ai-computing.io/npu", value: "true", effect: "NoSchedule" }],
    devices: { "furiosa.ai/rngd": 2, "rebellions.ai/ATOM": 2 },
    images: [IMAGE],
    log,
  });
  log(`real node ${NODE} up in ${Date.now() - s} ms`);
  rig.kubectl(["create", "namespace", NS]);
  runner = new PodRunner(rig, repo, NS);
  runner.start();
}, 900_000);

afterAll(async () => {
  await runner?.stop();
  await node?.stop();
  await rig?.stop();
  await reference?.stop();
  if (modelDir) rmSync(modelDir, { recursive: true, force: true });
});

describe("charts/rngd-pd on a real kubelet node", () => {
  let pod: Obj;

  test("default values (shm): the PD pod lands on the real node, is Ready through the kubelet's probes, and answers with airm up's tokens", async () => {
    const nodes = JSON.parse(rig.kubectl(["get", "nodes", "-o", "json"])).items as Obj[];
    const real = nodes.find((n) => n.metadata.name === NODE);
    expect(real.status.nodeInfo.containerRuntimeVersion).toMatch(/^containerd:\/\//);
    expect(real.status.allocatable["furiosa.ai/rngd"]).toBe("2");
    expect(real.metadata.annotations?.["kwok.x-k8s.io/node"]).toBeUndefined();
    const [repository, tag] = [IMAGE.slice(0, IMAGE.lastIndexOf(":")), IMAGE.slice(IMAGE.lastIndexOf(":") + 1)];
    const values = [
      `image.repository=${repository}`,
      `image.tag=${tag}`,
      "image.pullPolicy=Never",
      `model.hostPath=${modelDir}`,
      "model.path=/models/model",
      "maxModelLen=128",
      // The chart asks 1 + 1 + 0.2 CPU for a PD pod; this node has the machine's 2 cores.
      "prefill.resources.requests.cpu=500m",
      "decode.resources.requests.cpu=500m",
      // The node's taint, tolerated by the card-holding roles (a PD pod carries both).
      "prefill.tolerations[0].key=airm.ai-computing.io/npu",
      "prefill.tolerations[0].operator=Exists",
      "prefill.tolerations[0].effect=NoSchedule",
    ];
    const install = helmRun(["install", "rngd-pd", chart, ...values.flatMap((v) => ["--set", v]), "--wait", "--timeout", "240s"]);
    const helmDone: { failed?: Error } = {};
    install.catch((e: Error) => {
      helmDone.failed = e;
    });
    // The pod's start as this process sees it: first listed -> Ready (polled every 100 ms).
    const seen = await until("the PD pod created", () => helmDone.failed ?? pdPods()[0], 120_000, 100);
    if (helmDone.failed) throw helmDone.failed;
    const created = Date.now();
    const scheduled = await until("the PD pod scheduled", () => pdPods()[0]?.spec.nodeName, 60_000, 100);
    const readyAt = await until(
      "the PD pod Ready",
      () => {
        if (helmDone.failed) throw helmDone.failed;
        const p = pdPods()[0];
        return p?.status?.conditions?.some((c: Obj) => c.type === "Ready" && c.status === "True") ? Date.now() : null;
      },
      240_000,
      100,
    );
    await install;
    pod = pdPods()[0];
    expect(seen.metadata.name).toBe(pod.metadata.name);
    expect(scheduled).toBe(NODE);
    expect(pod.spec.tolerations).toContainEqual({ key: "airm.ai-computing.io/npu", operator: "Exists", effect: "NoSchedule" });
    const cond = Object.fromEntries((pod.status.conditions as Obj[]).map((c) => [c.type, c.lastTransitionTime]));
    const started = Object.fromEntries((pod.status.containerStatuses as Obj[]).map((c) => [c.name, c.state.running?.startedAt]));
    log(
      `POD START (image present): created -> Ready ${((readyAt - created) / 1000).toFixed(1)} s wall; ` +
        `created ${pod.metadata.creationTimestamp}, conditions ${JSON.stringify(cond)}, containers started ${JSON.stringify(started)}`,
    );
    // The kubelet ran it: an address from the node's pod CIDR, and nothing of it in the pod runner.
    expect(pod.status.podIP).toMatch(/^10\.89\.0\./);
    expect(runner.pods.size).toBe(0);
    expect(pod.spec.containers.map((c: Obj) => c.name)).toEqual(["prefill", "decode", "gateway"]);
    const want = await completion(reference.url);
    expect(await completion(`http://${pod.status.podIP}:8000`)).toEqual(want);
    log(`completion through ${pod.status.podIP}:8000 = airm up's: ${JSON.stringify(want)}`);
  });

  test("the containers as the kernel sees them: user, capabilities, read-only root, the shared KV tmpfs, cgroup memory", () => {
    expect(pod).toBeDefined();
    const pids = taskPids();
    const byName = new Map<string, { id: string; pid: number; spec: Obj }>();
    for (const cs of pod.status.containerStatuses as Obj[]) {
      const id = cs.containerID.replace("containerd://", "");
      byName.set(cs.name, { id, pid: pids.get(id)!, spec: pod.spec.containers.find((c: Obj) => c.name === cs.name) });
    }
    const lines: string[] = [];
    for (const [name, c] of byName) {
      expect(c.pid, `task of ${name}`).toBeGreaterThan(0);
      const st = procStatus(c.pid);
      const root = mounts(c.pid).find((m) => m.at === "/")!;
      const sc = c.spec.securityContext ?? {};
      lines.push(
        `${name}: Uid ${st.Uid}, Gid ${st.Gid}, CapEff ${st.CapEff}, CapBnd ${st.CapBnd}, NoNewPrivs ${st.NoNewPrivs}, root ${root.fs} ${root.opts.split(",")[0]}; chart securityContext ${JSON.stringify(sc)}`,
      );
      // Every container of the chart: no privilege escalation, read-only root, all capabilities dropped.
      expect(sc.readOnlyRootFilesystem).toBe(true);
      expect(root.opts.split(",")).toContain("ro");
      expect(st.CapEff).toBe("0000000000000000");
      expect(st.CapBnd).toBe("0000000000000000");
      expect(st.NoNewPrivs).toBe("1");
      // 65532: the gateway by its securityContext, the workers by the image's USER (workerSecurity.runAsNonRoot false sets none).
      expect(st.Uid!.split(/\s+/)).toEqual(["65532", "65532", "65532", "65532"]);
    }
    log(`containers:\n  ${lines.join("\n  ")}`);

    // One memory-backed emptyDir: the same tmpfs superblock in both workers, none in the gateway.
    const kv = (n: string) => mounts(byName.get(n)!.pid).find((m) => m.at === "/dev/shm/rngd_kv_cluster");
    const [p, d] = [kv("prefill"), kv("decode")];
    expect(p?.fs).toBe("tmpfs");
    expect(d?.fs).toBe("tmpfs");
    expect(p!.dev).toBe(d!.dev);
    expect(kv("gateway")).toBeUndefined();
    const onNode = mounts(process.pid).find((m) => m.at.endsWith(`/pods/${pod.metadata.uid}/volumes/kubernetes.io~empty-dir/kv-shm`));
    expect(onNode?.dev).toBe(p!.dev);
    log(`kv-shm: tmpfs ${p!.dev} in prefill and decode (${onNode!.at}, ${onNode!.opts})`);

    // cgroup v1 memory of each container after the completion, against the chart's requests/limits.
    const qos = String(pod.status.qosClass).toLowerCase();
    const rows: string[] = [];
    const read = (dir: string, f: string) => Number(readFileSync(join(dir, f), "utf8").trim());
    const statOf = (dir: string) =>
      Object.fromEntries(
        readFileSync(join(dir, "memory.stat"), "utf8")
          .trim()
          .split("\n")
          .map((l) => l.split(" "))
          .map(([k, v]) => [k!, Number(v)]),
      );
    const row = (label: string, dir: string, req: string, lim: string) => {
      const s = statOf(dir);
      const limit = read(dir, "memory.limit_in_bytes");
      rows.push(
        `${label.padEnd(8)} usage ${mib(read(dir, "memory.usage_in_bytes")).padStart(10)}  max ${mib(read(dir, "memory.max_usage_in_bytes")).padStart(10)}  ` +
          `rss ${mib(s.total_rss ?? s.rss ?? 0).padStart(10)}  cache ${mib(s.total_cache ?? s.cache ?? 0).padStart(10)}  shmem ${mib(s.total_shmem ?? s.shmem ?? 0).padStart(9)}  ` +
          `limit ${limit > 2 ** 60 ? "none" : mib(limit)}  | chart: request ${req}, limit ${lim}`,
      );
    };
    for (const [name, c] of byName)
      row(name, node.cgroup("memory", qos, pod.metadata.uid, c.id), c.spec.resources?.requests?.memory ?? "-", c.spec.resources?.limits?.memory ?? "-");
    row("pod", node.cgroup("memory", qos, pod.metadata.uid), "", "");
    log(`cgroup memory (QoS ${pod.status.qosClass}) after one completion:\n  ${rows.join("\n  ")}`);
    expect(read(node.cgroup("memory", qos, pod.metadata.uid, byName.get("gateway")!.id), "memory.limit_in_bytes")).toBe(1024 ** 3);
  });

  test("helm uninstall: no task, container, sandbox or mount of the pod stays on the node", async () => {
    expect(pod).toBeDefined();
    const uid = pod.metadata.uid as string;
    const ids = (pod.status.containerStatuses as Obj[]).map((c) => c.containerID.replace("containerd://", ""));
    const all = node.ctr(["containers", "ls", "-q"]).trim().split("\n").filter(Boolean);
    const sandbox = all.filter((id) => !ids.includes(id));
    expect(sandbox.length).toBe(1);
    const s = Date.now();
    await helmRun(["uninstall", "rngd-pd", "--wait", "--timeout", "120s"]);
    await until("the pod object gone", () => pdPods().length === 0 && JSON.parse(rig.kubectl(["get", "pods", "-n", NS, "-o", "json"])).items.length === 0, 120_000);
    const deleted = Date.now() - s;
    const left = () => ({
      tasks: node.ctr(["task", "ls", "-q"]).trim().split("\n").filter(Boolean),
      containers: node.ctr(["containers", "ls", "-q"]).trim().split("\n").filter(Boolean),
      mounts: execFileSync("findmnt", ["-rn", "-o", "TARGET"], { encoding: "utf8" })
        .split("\n")
        .filter((m) => m.includes(uid) || [...ids, ...sandbox].some((id) => m.includes(id))),
    });
    const tasksGone = await until("no task of the pod", () => left().tasks.length === 0 && Date.now(), 60_000);
    // The sandbox and the exited containers go at the kubelet's container GC (once a minute).
    const allGone = await until(
      "no container, sandbox or mount of the pod",
      () => {
        const l = left();
        return l.tasks.length + l.containers.length + l.mounts.length === 0 && Date.now();
      },
      150_000,
      1000,
    );
    log(`uninstall: pod gone ${deleted} ms, tasks gone +${tasksGone - s - deleted} ms, containers + sandbox + mounts gone ${allGone - s} ms after helm uninstall started`);
    expect(left()).toEqual({ tasks: [], containers: [], mounts: [] });
  });

  test("node.stop() leaves no process, mount, cgroup, link or folder of the node", async () => {
    const pids = node.pids();
    expect(pids.length).toBe(2);
    const s = Date.now();
    await node.stop();
    log(`node stopped in ${Date.now() - s} ms`);
    for (const pid of pids) expect(() => process.kill(pid, 0)).toThrow();
    const procs = readdirSync("/proc").filter((p) => /^\d+$/.test(p));
    const ofNode = procs.filter((p) => {
      try {
        return readFileSync(`/proc/${p}/cmdline`, "utf8").includes(node.dir) || readFileSync(`/proc/${p}/cgroup`, "utf8").includes(node.cgroupRoot);
      } catch {
        return false;
      }
    });
    expect(ofNode).toEqual([]);
    expect(
      execFileSync("findmnt", ["-rn", "-o", "TARGET"], { encoding: "utf8" })
        .split("\n")
        .filter((m) => m.startsWith(node.dir)),
    ).toEqual([]);
    expect(readdirSync("/sys/fs/cgroup").filter((c) => existsSync(join("/sys/fs/cgroup", c, node.cgroupRoot)))).toEqual([]);
    expect(execFileSync("ip", ["-o", "link"], { encoding: "utf8" })).not.toMatch(/airm-(node|cni)\d/);
    expect(existsSync(node.dir)).toBe(false);
  });
});
