// A real Kubernetes control plane on loopback for the chart's tests: etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler and kwok (which plays the kubelets and gives pods
// addresses in 127.1.0.0/24), built by build.sh and started here in a folder of their own. Nothing
// is mocked but the kubelets. Every part binds 127.0.0.1 (kwok's pod addresses are loopback too).
// kwok manages only the nodes created here; node.ts adds real ones (containerd + kubelet) beside them.
// A signal to the process that started the rig kills the parts and removes the folder
// (../rig-cleanup.ts), and the parts die with that process however it dies.
import { type ChildProcess, execFileSync, spawn, spawnSync } from "node:child_process";
import { closeSync, mkdirSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { constants, tmpdir } from "node:os";
import { join } from "node:path";
import { diesWithParent, killTrees, onInterrupt } from "../rig-cleanup.ts";

export interface RigNode {
  name: string;
  labels: Record<string, string>;
  /** Extended resources the node offers (e.g. { "furiosa.ai/rngd": 2 }). */
  devices?: Record<string, number>;
}

/**
 * Re-runs the script `file` with `argv` in a network namespace of its own with only lo up
 * (unshare -rn: a user namespace maps root), and exits with its status. Build what the run needs
 * before calling it: the namespace has no network. This process waits blocked in spawnSync and
 * cannot pass a signal on, so the run gets SIGTERM from the kernel when this process dies (its
 * rigs' teardowns then run there).
 */
export function rerunInNetns(file: string, argv: string[]): never {
  const inner = ["unshare", "-rn", "--", "sh", "-c", 'ip link set lo up && exec "$0" --import tsx "$@"', process.execPath, file, ...argv];
  const r = spawnSync("setpriv", ["--pdeathsig", "TERM", "--", ...inner], { stdio: "inherit" });
  process.exit(r.status ?? (r.signal ? 128 + constants.signals[r.signal] : 1));
}

/** One kwok node with both cards (4 of each), labelled as the chart's PD pods select. */
export const NPU_BOTH_NODE: RigNode = {
  name: "npu-both",
  labels: { "airm.ai-computing.io/furiosa.RNGD": "true", "airm.ai-computing.io/rebellions.ATOM": "true" },
  devices: { "furiosa.ai/rngd": 4, "rebellions.ai/ATOM": 4 },
};

export interface Rig {
  dir: string;
  kubeconfig: string;
  /** Runs kubectl against the rig; returns stdout. Throws with stderr on failure. */
  kubectl(args: string[], input?: string): string;
  /** Pids of the control plane's processes. */
  pids(): number[];
  stop(): Promise<void>;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** A free TCP port on 127.0.0.1 (closed again before it is returned). */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address() as { port: number };
      s.close(() => resolve(port));
    });
  });
}

/** The folder build.sh built into (builds it when missing: ~11 min cold). */
export function rigBinaries(): string {
  return execFileSync("bash", [join(import.meta.dirname, "build.sh")], { encoding: "utf8", stdio: ["ignore", "pipe", "inherit"] }).trim();
}

function openssl(dir: string, args: string[]): void {
  execFileSync("openssl", args, { cwd: dir, stdio: ["ignore", "ignore", "pipe"] });
}

/** A CA, the apiserver's serving certificate, an admin client certificate and the service-account keys. */
function makePki(dir: string): void {
  openssl(dir, ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "3", "-subj", "/CN=airm-rig-ca"]);
  const sign = (name: string, subj: string, ext: string) => {
    openssl(dir, ["req", "-newkey", "rsa:2048", "-nodes", "-keyout", `${name}.key`, "-out", `${name}.csr`, "-subj", subj]);
    writeFileSync(join(dir, `${name}.ext`), ext);
    openssl(dir, ["x509", "-req", "-in", `${name}.csr`, "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-out", `${name}.crt`, "-days", "3", "-extfile", `${name}.ext`]);
  };
  sign("apiserver", "/CN=kube-apiserver", "subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc\n");
  sign("admin", "/CN=admin/O=system:masters", "extendedKeyUsage=clientAuth\n");
  openssl(dir, ["genrsa", "-out", "sa.key", "2048"]);
  openssl(dir, ["rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub"]);
}

function kubeconfig(dir: string, port: number): string {
  const path = join(dir, "kubeconfig");
  writeFileSync(
    path,
    [
      "apiVersion: v1",
      "kind: Config",
      "clusters:",
      "- name: rig",
      "  cluster:",
      `    server: https://127.0.0.1:${port}`,
      `    certificate-authority: ${join(dir, "ca.crt")}`,
      "users:",
      "- name: admin",
      "  user:",
      `    client-certificate: ${join(dir, "admin.crt")}`,
      `    client-key: ${join(dir, "admin.key")}`,
      "contexts:",
      "- name: rig",
      "  context: { cluster: rig, user: admin }",
      "current-context: rig",
      "",
    ].join("\n"),
  );
  return path;
}

/** A part of the rig: its process and the file its output goes to. */
interface RigPart {
  name: string;
  child: ChildProcess;
  logFile: string;
}

/** The last `lines` lines of a part's output. */
function tail(p: RigPart, lines: number): string {
  try {
    return readFileSync(p.logFile, "utf8").split("\n").slice(-lines).join("\n");
  } catch {
    return "";
  }
}

async function waitFor(what: string, check: () => boolean | Promise<boolean>, ms: number, parts: RigPart[]): Promise<void> {
  const until = Date.now() + ms;
  while (Date.now() < until) {
    for (const p of parts) {
      if (p.child.exitCode !== null) throw new Error(`k8s rig: ${p.name} exited ${p.child.exitCode} while waiting for ${what}:\n${tail(p, 15)}`);
    }
    if (await check()) return;
    await sleep(200);
  }
  throw new Error(`k8s rig: ${what} not ready within ${ms} ms`);
}

/**
 * kwok's pod-ready stage turned into a pod-running one: the pod gets its IP and phase Running but
 * Ready (and ContainersReady, and each container's ready) stays False. Readiness is the pod
 * runner's to set, from the containers' readiness probes against the real processes, as a
 * kubelet would; kwok alone marks every pod Ready at once, so a rollout would delete old pods
 * while the new ones still load. Written into the rig's folder; returns its path.
 */
function podRunningStage(podReady: string, dir: string): string {
  let text = readFileSync(podReady, "utf8");
  const swaps: [RegExp, string][] = [
    [/status: "True"(\s+)type: Ready\b/, 'status: "False"$1type: Ready'],
    [/status: "True"(\s+)type: ContainersReady\b/, 'status: "False"$1type: ContainersReady'],
    [/(containerStatuses:[\s\S]*?)ready: true/, "$1ready: false"],
    [/name: pod-ready\b/, "name: pod-running"],
  ];
  for (const [from, to] of swaps) {
    if (!from.test(text)) throw new Error(`k8s rig: kwok's ${podReady} no longer has ${from}; the pod-running stage needs updating`);
    text = text.replace(from, to);
  }
  const out = join(dir, "pod-running.yaml");
  writeFileSync(out, text);
  return out;
}

/** The annotation (and label) kwok manages nodes by: only the rig's fake nodes carry it, never a real one (node.ts). */
export const KWOK_NODE = ["kwok.x-k8s.io/node", "fake"] as const;

function nodeManifest(n: RigNode): string {
  const alloc = { cpu: "32", memory: "256Gi", pods: "110", ...Object.fromEntries(Object.entries(n.devices ?? {}).map(([k, v]) => [k, String(v)])) };
  return JSON.stringify({
    apiVersion: "v1",
    kind: "Node",
    metadata: {
      name: n.name,
      labels: { "kubernetes.io/hostname": n.name, [KWOK_NODE[0]]: KWOK_NODE[1], ...n.labels },
      annotations: { [KWOK_NODE[0]]: KWOK_NODE[1], "node.alpha.kubernetes.io/ttl": "0" },
    },
    spec: {},
    status: { allocatable: alloc, capacity: alloc },
  });
}

/** Starts the control plane and kwok, and creates `nodes`. Resolves once every node is Ready. */
export async function startRig(nodes: RigNode[], opts: { log?: (line: string) => void } = {}): Promise<Rig> {
  const bin = rigBinaries();
  const dir = mkdtempSync(join(tmpdir(), "airm-k8s-rig-"));
  const parts: RigPart[] = [];
  // Until stop() is done: a signal (or any exit) kills the parts still running and removes the folder.
  const forget = onInterrupt(() => {
    killTrees(parts.filter((p) => p.child.exitCode === null && p.child.signalCode === null).map((p) => p.child.pid!));
    rmSync(dir, { recursive: true, force: true });
  });
  makePki(dir);
  const [etcdPort, peerPort, apiPort] = [await freePort(), await freePort(), await freePort()];
  const kc = kubeconfig(dir, apiPort);
  // Output goes to a file, not a pipe: the tests call helm and kubectl synchronously, and a pipe
  // nobody reads for the length of a `helm --wait` fills up and stops a chatty component (the
  // controller-manager then created no ReplicaSet, and every wait timed out).
  const start = (name: string, exe: string, args: string[]) => {
    const logFile = join(dir, `${name}.log`);
    const fd = openSync(logFile, "a");
    const child = spawn(...diesWithParent([join(bin, "bin", exe), ...args]), { cwd: dir, stdio: ["ignore", fd, fd], env: { ...process.env, KUBECONFIG: kc } });
    closeSync(fd);
    parts.push({ name, child, logFile });
  };
  const kubectl = (args: string[], input?: string): string => {
    try {
      return execFileSync(join(bin, "bin", "kubectl"), ["--kubeconfig", kc, ...args], { encoding: "utf8", input, stdio: ["pipe", "pipe", "pipe"] });
    } catch (e) {
      const err = e as { stderr?: string; message: string };
      throw new Error(`kubectl ${args.join(" ")}: ${err.stderr ?? err.message}`);
    }
  };
  const stop = async () => {
    for (const p of [...parts].reverse()) if (p.child.exitCode === null) p.child.kill("SIGTERM");
    await sleep(300);
    for (const p of parts) if (p.child.exitCode === null) p.child.kill("SIGKILL");
    rmSync(dir, { recursive: true, force: true });
    forget();
  };
  try {
    mkdirSync(join(dir, "etcd"));
    start("etcd", "etcd", [
      "--name=rig",
      `--data-dir=${join(dir, "etcd")}`,
      `--listen-client-urls=http://127.0.0.1:${etcdPort}`,
      `--advertise-client-urls=http://127.0.0.1:${etcdPort}`,
      `--listen-peer-urls=http://127.0.0.1:${peerPort}`,
      `--initial-advertise-peer-urls=http://127.0.0.1:${peerPort}`,
      `--initial-cluster=rig=http://127.0.0.1:${peerPort}`,
      "--listen-metrics-urls=",
    ]);
    start("kube-apiserver", "kube-apiserver", [
      `--etcd-servers=http://127.0.0.1:${etcdPort}`,
      "--bind-address=127.0.0.1",
      "--advertise-address=127.0.0.1",
      `--secure-port=${apiPort}`,
      "--tls-cert-file=apiserver.crt",
      "--tls-private-key-file=apiserver.key",
      "--client-ca-file=ca.crt",
      "--service-account-issuer=https://kubernetes.default.svc",
      "--service-account-key-file=sa.pub",
      "--service-account-signing-key-file=sa.key",
      "--service-cluster-ip-range=10.96.0.0/16",
      "--authorization-mode=RBAC",
      "--disable-admission-plugins=ServiceAccount",
      "--endpoint-reconciler-type=none",
      "--allow-privileged=true",
      // A real node (node.ts) is reached at its InternalIP: there is no DNS for node names here.
      "--kubelet-preferred-address-types=InternalIP",
    ]);
    await waitFor(
      "kube-apiserver /readyz",
      () => {
        try {
          return kubectl(["get", "--raw", "/readyz"]).trim() === "ok";
        } catch {
          return false;
        }
      },
      60_000,
      parts,
    );
    start("kube-controller-manager", "kube-controller-manager", [
      `--kubeconfig=${kc}`,
      "--leader-elect=false",
      "--bind-address=127.0.0.1",
      "--secure-port=0",
      "--controllers=*,-nodeipam",
      "--service-account-private-key-file=sa.key",
      "--root-ca-file=ca.crt",
    ]);
    start("kube-scheduler", "kube-scheduler", [`--kubeconfig=${kc}`, "--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port=0"]);
    const stages = ["node-initialize", "node-heartbeat", "pod-complete", "pod-delete"].flatMap((s) => ["--config", join(bin, "stages", `${s}.yaml`)]);
    stages.push("--config", podRunningStage(join(bin, "stages", "pod-ready.yaml"), dir));
    start("kwok", "kwok", [
      `--kubeconfig=${kc}`,
      // Only the nodes created below (annotated): a real kubelet's node (node.ts) is its own.
      "--manage-all-nodes=false",
      `--manage-nodes-with-annotation-selector=${KWOK_NODE[0]}=${KWOK_NODE[1]}`,
      "--cidr=127.1.0.0/24",
      "--node-ip=127.0.0.1",
      "--server-address=",
      ...stages,
    ]);
    for (const n of nodes) kubectl(["create", "-f", "-"], nodeManifest(n));
    await waitFor(
      "nodes Ready",
      () => {
        const out = kubectl(["get", "nodes", "-o", "jsonpath={range .items[*]}{.status.conditions[?(@.type=='Ready')].status}{' '}{end}"]).trim().split(/\s+/);
        return out.length === nodes.length && out.every((s) => s === "True");
      },
      60_000,
      parts,
    );
    opts.log?.(`k8s rig up in ${dir}`);
    return { dir, kubeconfig: kc, kubectl, stop, pids: () => parts.map((p) => p.child.pid!).filter(Boolean) };
  } catch (e) {
    await stop();
    throw e;
  }
}
