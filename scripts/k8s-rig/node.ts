// A real node for the rig (NODE.md): containerd 2 and kubelet 1.36 (built by build-node.sh)
// joined to the rig's control plane beside kwok's fake nodes, running pods from images imported
// into containerd's k8s.io namespace (no registry). Only inside the host setup test-node.sh makes
// (private network and mount namespaces, real root): the node takes an address on a bridge of its
// own, a cgroup root of its own, and pods that really run (runc, overlayfs, CNI bridge, probes).
// Until stop() is done, a signal to this process kills the kubelet, containerd, the shims and the
// containers at once and removes the node's mounts, cgroups, links and folder (../rig-cleanup.ts);
// kubelet and containerd also die with this process however it dies (test-node.sh then removes
// the rest).
import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { closeSync, existsSync, mkdirSync, mkdtempSync, openSync, readdirSync, readFileSync, renameSync, rmdirSync, rmSync, statSync, writeFileSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";
import { diesWithParent, killTrees, onInterrupt, processes, signalAll, sleepSync } from "../rig-cleanup.ts";
import type { Rig } from "./rig.ts";

export interface NodeTaint {
  key: string;
  value?: string;
  effect: "NoSchedule" | "PreferNoSchedule" | "NoExecute";
}

export interface NodeOptions {
  name: string;
  labels?: Record<string, string>;
  taints?: NodeTaint[];
  /** Extended resources patched into the Node's status capacity (e.g. { "furiosa.ai/rngd": 2 }): no device plugin needed. */
  devices?: Record<string, number>;
  /** Podman image references to import into containerd (the pause image always is). */
  images?: string[];
  log?: (line: string) => void;
}

export interface RealNode {
  name: string;
  /** The node's InternalIP (the kubelet listens there; pods are in `podCidr`). */
  ip: string;
  podCidr: string;
  /** The node's folder: containerd's root and state, the kubelet's root, logs. */
  dir: string;
  /** kubelet's cgroupRoot (a folder of its own in every cgroup v1 hierarchy). */
  cgroupRoot: string;
  /** Runs `ctr -n k8s.io` against the node's containerd; returns stdout. */
  ctr(args: string[]): string;
  /** A container's (or pod's, without `containerId`) cgroup folder in `controller`'s hierarchy. */
  cgroup(controller: string, qos: string, podUid: string, containerId?: string): string;
  /** Pids of kubelet and containerd. */
  pids(): number[];
  /** Stops kubelet and containerd and removes every process, mount, cgroup, link and file the node made. */
  stop(): Promise<void>;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
let nodes = 0;

function sh(cmd: string, args: string[], opts: { input?: string; env?: NodeJS.ProcessEnv } = {}): string {
  try {
    return execFileSync(cmd, args, { encoding: "utf8", input: opts.input, env: opts.env ?? process.env, stdio: ["pipe", "pipe", "pipe"], maxBuffer: 64 << 20 });
  } catch (e) {
    const err = e as { stderr?: string; message: string };
    throw new Error(`${cmd} ${args.join(" ")}: ${err.stderr || err.message}`);
  }
}

/** The folder build-node.sh built into (builds it when missing: ~21 min cold on 2 cores). */
export function nodeBinaries(): string {
  return execFileSync("bash", [join(import.meta.dirname, "build-node.sh")], { encoding: "utf8", stdio: ["ignore", "pipe", "inherit"] }).trim();
}

const PODMAN_ENV = { ...process.env, CONTAINERS_CONF: join(import.meta.dirname, "..", "image", "containers.conf") };

/**
 * A containerd root holding the pause image and `images`, imported and unpacked once per (node
 * binaries, image ids) under ~/.cache/airm/node-seed by a containerd without CRI; each node then
 * hard-links it (1-2 s instead of ~35 s for podman save | ctr import). Older seeds are removed.
 */
function seedRoot(bin: string, images: string[], log: (l: string) => void): string {
  const ids = images.map((i) => sh("podman", ["image", "inspect", "--format", "{{.Id}}", i], { env: PODMAN_ENV }).trim().slice(0, 16));
  const cache = join(homedir(), ".cache", "airm", "node-seed");
  const key = `${bin.split("/").pop()}-${ids.join("-") || "pause"}`;
  const root = join(cache, key);
  if (existsSync(join(root, "done"))) return join(root, "root");
  mkdirSync(cache, { recursive: true });
  const tmp = mkdtempSync(join(cache, `${key}.tmp-`));
  const t0 = Date.now();
  // socket, state and log in a short folder of their own (unix socket paths stop at 108 bytes)
  const run = mkdtempSync(join(process.env.RIG_NODE_TMP ?? "/tmp", "seed-"));
  const sock = join(run, "sock");
  writeFileSync(
    join(run, "config.toml"),
    `version = 3
root = "${tmp}/root"
state = "${run}/state"
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime", "io.containerd.cri.v1.images"]
[grpc]
  address = "${sock}"
[ttrpc]
  address = "${sock}.ttrpc"
[plugins.'io.containerd.internal.v1.opt']
  path = "${tmp}/opt"
`,
  );
  const fd = openSync(join(run, "containerd.log"), "a");
  const child = spawn(join(bin, "bin", "containerd"), ["--config", join(run, "config.toml")], { stdio: ["ignore", fd, fd] });
  closeSync(fd);
  try {
    for (let i = 0; i < 300 && !existsSync(sock); i++) execFileSync("sleep", ["0.1"]);
    if (!existsSync(sock)) throw new Error(`node seed: containerd did not start:\n${readFileSync(join(run, "containerd.log"), "utf8").slice(-2000)}`);
    const ctr = join(bin, "bin", "ctr");
    sh(ctr, ["--address", sock, "-n", "k8s.io", "images", "import", join(bin, "pause.tar")]);
    // podman save streamed straight into ctr import (no archive on disk)
    for (const image of images)
      sh("bash", ["-o", "pipefail", "-c", `podman save --format docker-archive "$1" | "$2" --address "$3" -n k8s.io images import -`, "save", image, ctr, sock], {
        env: PODMAN_ENV,
      });
  } catch (e) {
    rmSync(tmp, { recursive: true, force: true });
    throw e;
  } finally {
    child.kill("SIGTERM");
    execFileSync("sleep", ["0.5"]);
    rmSync(run, { recursive: true, force: true });
  }
  writeFileSync(join(tmp, "done"), "");
  for (const old of readdirSync(cache)) if (old !== key && join(cache, old) !== tmp) rmSync(join(cache, old), { recursive: true, force: true });
  try {
    renameSync(tmp, root);
  } catch {
    rmSync(tmp, { recursive: true, force: true }); // a parallel run made it first
  }
  log(`node seed ${root}: pause + ${images.join(", ")} imported in ${Date.now() - t0} ms`);
  return join(root, "root");
}

function containerdConfig(cd: string, sock: string, cniDir: string, cniBin: string): string {
  return `version = 3
root = "${cd}/root"
state = "${cd}/state"
temp = "${cd}/tmp"
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.erofs", "io.containerd.snapshotter.v1.blockfile", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "${sock}"
[ttrpc]
  address = "${sock}.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""

[plugins]
  [plugins.'io.containerd.internal.v1.opt']
    path = "${cd}/opt"
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = "overlayfs"
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = "localhost/pause:airm"
  [plugins.'io.containerd.cri.v1.runtime']
    restrict_oom_score_adj = true
    netns_mounts_under_state_dir = true
    cdi_spec_dirs = []
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = "runc"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = "/usr/sbin/runc"
          SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ["${cniBin}"]
      conf_dir = "${cniDir}"
  [plugins.'io.containerd.grpc.v1.cri']
    disable_tcp_service = true
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
`;
}

function kubeletConfig(o: { cgroupRoot: string; sock: string; ip: string; pki: string; ca: string; podLogs: string }): string {
  return `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupsPerQOS: true
cgroupRoot: ${o.cgroupRoot}
enforceNodeAllocatable: ["pods"]
containerRuntimeEndpoint: unix://${o.sock}
imageServiceEndpoint: unix://${o.sock}
address: ${o.ip}
port: 10250
readOnlyPort: 0
healthzBindAddress: ${o.ip}
healthzPort: 10248
tlsCertFile: ${join(o.pki, "kubelet-serving.crt")}
tlsPrivateKeyFile: ${join(o.pki, "kubelet-serving.key")}
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
  x509: {clientCAFile: ${o.ca}}
authorization: {mode: AlwaysAllow}
failSwapOn: false
oomScoreAdj: 0
protectKernelDefaults: false
podLogsDir: ${o.podLogs}
resolvConf: ""
maxPods: 32
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "1Mi", nodefs.available: "1%", nodefs.inodesFree: "1%", imagefs.available: "1%"}
evictionPressureTransitionPeriod: 5s
nodeStatusUpdateFrequency: 2s
nodeStatusReportFrequency: 10s
syncFrequency: 5s
fileCheckFrequency: 5s
shutdownGracePeriod: 0s
`;
}

/** The kubelet's client certificate (system:node:<name>, group system:nodes) and serving certificate, signed by the rig's CA. */
function nodePki(rig: Rig, pki: string, name: string, ip: string): void {
  const sign = (file: string, subj: string, ext: string) => {
    sh("openssl", ["req", "-newkey", "rsa:2048", "-nodes", "-keyout", join(pki, `${file}.key`), "-out", join(pki, `${file}.csr`), "-subj", subj]);
    writeFileSync(join(pki, `${file}.ext`), ext);
    const ca = ["-CA", join(rig.dir, "ca.crt"), "-CAkey", join(rig.dir, "ca.key"), "-CAcreateserial"];
    sh("openssl", ["x509", "-req", "-in", join(pki, `${file}.csr`), ...ca, "-out", join(pki, `${file}.crt`), "-days", "3", "-extfile", join(pki, `${file}.ext`)]);
  };
  sign("kubelet-client", `/CN=system:node:${name}/O=system:nodes`, "extendedKeyUsage=clientAuth\n");
  sign("kubelet-serving", `/CN=${name}`, `extendedKeyUsage=serverAuth\nsubjectAltName=IP:${ip},DNS:${name}\n`);
}

/** The rig authorizes by RBAC only (no Node authorizer): the built-in system:node role for the group system:nodes, once. */
function bindNodeRole(rig: Rig): void {
  try {
    rig.kubectl(["create", "clusterrolebinding", "airm-system-nodes", "--clusterrole=system:node", "--group=system:nodes"]);
  } catch (e) {
    if (!/AlreadyExists/.test((e as Error).message)) throw e;
  }
}

function kubeconfig(rig: Rig, pki: string): string {
  const server = /server: (\S+)/.exec(readFileSync(rig.kubeconfig, "utf8"))![1];
  return `apiVersion: v1
kind: Config
clusters:
- name: rig
  cluster: {server: "${server}", certificate-authority: "${join(rig.dir, "ca.crt")}"}
users:
- name: kubelet
  user: {client-certificate: "${join(pki, "kubelet-client.crt")}", client-key: "${join(pki, "kubelet-client.key")}"}
contexts:
- name: rig
  context: {cluster: rig, user: kubelet}
current-context: rig
`;
}

/** Mount points at or under `dir` in this mount namespace, deepest first. */
function mountsUnder(dir: string): string[] {
  return sh("findmnt", ["-rn", "-o", "TARGET"])
    .split("\n")
    .filter((m) => m === dir || m.startsWith(`${dir}/`))
    .reverse();
}

/** The cgroup v1 hierarchies to give the node a root in (all but the unified one). */
const hierarchies = () => readdirSync("/sys/fs/cgroup").filter((c) => c !== "unified" && statSync(join("/sys/fs/cgroup", c)).isDirectory());

function rmCgroupTree(dir: string): void {
  if (!existsSync(dir)) return;
  for (const e of readdirSync(dir, { withFileTypes: true })) if (e.isDirectory()) rmCgroupTree(join(dir, e.name));
  rmdirSync(dir);
}

/** Pids of the processes in the node's cgroups (its containers), from the pids hierarchy. */
function cgroupPids(cgroupRoot: string): number[] {
  const dir = join("/sys/fs/cgroup/pids", cgroupRoot);
  if (!existsSync(dir)) return [];
  return sh("find", [dir, "-name", "cgroup.procs", "-exec", "cat", "{}", "+"]).split("\n").filter(Boolean).map(Number);
}

/** The node's containerd shims: they outlive containerd, and name its socket on their command line. */
function shimPids(sock: string): number[] {
  return processes()
    .filter((p) => p.cmdline.includes("containerd-shim") && p.cmdline.includes(sock))
    .map((p) => p.pid);
}

/** A process of the node (kubelet, containerd) and the file its output goes to. */
interface NodeProc {
  name: string;
  child: ChildProcess;
  logFile: string;
}

const running = (p: NodeProc) => p.child.exitCode === null && p.child.signalCode === null;

/** SIGTERM, then SIGKILL if it still runs 10 s later. */
async function halt(p: NodeProc | undefined): Promise<void> {
  if (!p || !running(p)) return;
  p.child.kill("SIGTERM");
  for (let t = 0; t < 100 && running(p); t++) await sleep(100);
  if (running(p)) p.child.kill("SIGKILL");
}

/** What a node leaves besides its processes: mounts and files under its folder, its cgroups, its links. */
interface NodeTraces {
  dir: string;
  cgroupRoot: string;
  links: string[];
  log: (line: string) => void;
}

/** Unmounts what is left under the node's folder and removes its cgroups, links and folder (its processes must be gone). */
function removeTraces(t: NodeTraces): void {
  for (const m of mountsUnder(t.dir)) {
    try {
      sh("umount", ["-l", m]);
    } catch {}
  }
  // every hierarchy, the unified one too: runc's cgroupfs manager creates the path there as well
  for (const c of readdirSync("/sys/fs/cgroup")) {
    try {
      rmCgroupTree(join("/sys/fs/cgroup", c, t.cgroupRoot));
    } catch (e) {
      t.log(`node: cgroup ${c}${t.cgroupRoot}: ${(e as Error).message}`);
    }
  }
  for (const l of t.links) {
    try {
      sh("ip", ["link", "del", l]);
    } catch {}
  }
  rmSync(t.dir, { recursive: true, force: true });
}

/**
 * The teardown on a signal: kubelet and containerd SIGKILLed first (nothing starts a container
 * then), then every container and shim at once; once the cgroups are empty, the traces.
 */
function killNode(procs: NodeProc[], sock: string, t: NodeTraces): void {
  killTrees(procs.filter(running).map((p) => p.child.pid!));
  killTrees([...cgroupPids(t.cgroupRoot), ...shimPids(sock)]);
  for (let i = 0; i < 50 && cgroupPids(t.cgroupRoot).length; i++) sleepSync(100);
  removeTraces(t);
}

/**
 * Starts containerd and a kubelet for node `o.name`, registered with the rig's apiserver, and
 * resolves once the Node is Ready with `o.devices` in its allocatable. Needs the environment
 * test-node.sh sets up (RIG_NODE_NS): it refuses to run on a host it would change.
 */
export async function startNode(rig: Rig, o: NodeOptions): Promise<RealNode> {
  if (process.env.RIG_NODE_NS !== "1") throw new Error("startNode: run inside scripts/k8s-rig/test-node.sh (private network and mount namespaces, real root)");
  const log = o.log ?? (() => {});
  const bin = nodeBinaries();
  const i = nodes++;
  const ip = `10.250.0.${i + 1}`;
  const podCidr = `10.89.${i}.0/24`;
  const D = mkdtempSync(join(process.env.RIG_NODE_TMP ?? "/tmp", `airm-node-${o.name}-`));
  const CD = join(D, "containerd");
  const sock = join(CD, "containerd.sock");
  const pki = join(D, "pki");
  const cgroupRoot = `/${process.env.RIG_NODE_CGROUP_PREFIX ?? `airm-node-${process.pid}`}-${o.name}`;
  const link = `airm-node${i}`;
  const cniBridge = `airm-cni${i}`;
  const procs: NodeProc[] = [];
  const traces: NodeTraces = { dir: D, cgroupRoot, links: [link, cniBridge], log };
  const forget = onInterrupt(() => killNode(procs, sock, traces));
  const ctr = (args: string[]) => sh(join(bin, "bin", "ctr"), ["--address", sock, "-n", "k8s.io", ...args]);
  const tail = (f: string) => (existsSync(f) ? readFileSync(f, "utf8").split("\n").slice(-30).join("\n") : "");
  const start = (name: string, args: string[]) => {
    const logFile = join(D, `${name}.log`);
    const fd = openSync(logFile, "a");
    // containerd starts containerd-shim-runc-v2 from its PATH
    const env = { ...process.env, PATH: `${join(bin, "bin")}:${process.env.PATH}` };
    const child = spawn(...diesWithParent([join(bin, "bin", name), ...args]), { cwd: D, stdio: ["ignore", fd, fd], env });
    closeSync(fd);
    procs.push({ name, child, logFile });
  };
  const waitFor = async (what: string, check: () => boolean, ms: number) => {
    const t0 = Date.now();
    while (Date.now() - t0 < ms) {
      for (const p of procs) if (p.child.exitCode !== null) throw new Error(`node ${o.name}: ${p.name} exited ${p.child.exitCode} waiting for ${what}:\n${tail(p.logFile)}`);
      try {
        if (check()) return Date.now() - t0;
      } catch {}
      await sleep(100);
    }
    throw new Error(`node ${o.name}: ${what} not within ${ms} ms\n${procs.map((p) => `--- ${p.name}\n${tail(p.logFile)}`).join("\n")}`);
  };

  const stop = async () => {
    // kubelet first (nothing restarts containers then), then every container still there, then containerd.
    await halt(procs.find((p) => p.name === "kubelet"));
    signalAll(cgroupPids(cgroupRoot), "SIGKILL");
    await halt(procs.find((p) => p.name === "containerd"));
    signalAll(shimPids(sock), "SIGKILL");
    for (let t = 0; t < 50 && cgroupPids(cgroupRoot).length; t++) await sleep(100);
    removeTraces(traces);
    forget();
  };

  try {
    for (const d of [CD, join(D, "kubelet"), join(D, "cni/net.d"), join(D, "cni/ipam"), join(D, "pod-logs"), pki]) mkdirSync(d, { recursive: true });
    // kubelet refuses a loopback node IP; this kernel has no dummy links: an empty bridge carries it.
    sh("ip", ["link", "add", link, "type", "bridge"]);
    sh("ip", ["addr", "add", `${ip}/32`, "dev", link]);
    sh("ip", ["link", "set", link, "up"]);
    // kubelet's cgroupRoot must exist in every hierarchy; a new cpuset needs cpus and mems or no task joins it.
    for (const c of hierarchies()) mkdirSync(join("/sys/fs/cgroup", c, cgroupRoot));
    for (const f of ["cpuset.cpus", "cpuset.mems"]) writeFileSync(join("/sys/fs/cgroup/cpuset", cgroupRoot, f), readFileSync(join("/sys/fs/cgroup/cpuset", f)));

    nodePki(rig, pki, o.name, ip);
    bindNodeRole(rig);
    writeFileSync(join(D, "kubelet.kubeconfig"), kubeconfig(rig, pki));
    writeFileSync(join(CD, "config.toml"), containerdConfig(CD, sock, join(D, "cni/net.d"), existsSync("/usr/lib/cni/bridge") ? "/usr/lib/cni" : join(bin, "cni")));
    const ipam = { type: "host-local", ranges: [[{ subnet: podCidr }]], routes: [{ dst: "0.0.0.0/0" }], dataDir: join(D, "cni/ipam") };
    const bridge = { type: "bridge", bridge: cniBridge, isGateway: true, ipMasq: false, hairpinMode: true, ipam };
    writeFileSync(join(D, "cni/net.d/10-airm.conflist"), JSON.stringify({ cniVersion: "1.0.0", name: `airm-pods-${i}`, plugins: [bridge] }));

    // Images: hard links of a seeded containerd root (its bolt databases copied: they are written in place).
    const seed = seedRoot(bin, o.images ?? [], log);
    const s0 = Date.now();
    sh("cp", ["-al", seed, join(CD, "root")]);
    for (const db of sh("find", [seed, "-name", "*.db"]).trim().split("\n").filter(Boolean)) sh("cp", ["--remove-destination", db, join(CD, "root", db.slice(seed.length))]);
    log(`node ${o.name}: containerd root from ${seed} in ${Date.now() - s0} ms`);
    start("containerd", ["--config", join(CD, "config.toml")]);
    await waitFor("containerd's socket", () => existsSync(sock) && ctr(["version"]).includes("Server"), 30_000);

    writeFileSync(join(D, "kubelet-config.yaml"), kubeletConfig({ cgroupRoot, sock, ip, pki, ca: join(rig.dir, "ca.crt"), podLogs: join(D, "pod-logs") }));
    const labels = Object.entries(o.labels ?? {}).map(([k, v]) => `${k}=${v}`);
    const taints = (o.taints ?? []).map((t) => `${t.key}${t.value === undefined ? "" : `=${t.value}`}:${t.effect}`);
    const k0 = Date.now();
    start("kubelet", [
      `--config=${join(D, "kubelet-config.yaml")}`,
      `--kubeconfig=${join(D, "kubelet.kubeconfig")}`,
      `--root-dir=${join(D, "kubelet")}`,
      `--cert-dir=${pki}`,
      `--hostname-override=${o.name}`,
      `--node-ip=${ip}`,
      ...(labels.length ? [`--node-labels=${labels.join(",")}`] : []),
      ...(taints.length ? [`--register-with-taints=${taints.join(",")}`] : []),
      "--v=2",
    ]);
    const jp = (path: string) => rig.kubectl(["get", "node", o.name, "-o", `jsonpath=${path}`]).trim();
    await waitFor("the Node Ready", () => jp("{.status.conditions[?(@.type=='Ready')].status}") === "True", 120_000);
    const devices = Object.entries(o.devices ?? {});
    if (devices.length) {
      // The documented way to advertise extended resources without a device plugin: the Node's
      // status capacity; the kubelet derives allocatable from it at its next status update.
      const patch = devices.map(([k, v]) => ({ op: "add", path: `/status/capacity/${k.replace(/~/g, "~0").replace(/\//g, "~1")}`, value: String(v) }));
      rig.kubectl(["patch", "node", o.name, "--subresource=status", "--type=json", "-p", JSON.stringify(patch)]);
      await waitFor(
        "the extended resources allocatable",
        () => {
          const alloc = JSON.parse(jp("{.status.allocatable}") || "{}") as Record<string, string>;
          return devices.every(([k, v]) => alloc[k] === String(v));
        },
        30_000,
      );
    }
    log(`node ${o.name} Ready at ${ip} (pods ${podCidr}) ${Date.now() - k0} ms after the kubelet started`);
  } catch (e) {
    await stop();
    throw e;
  }
  return {
    name: o.name,
    ip,
    podCidr,
    dir: D,
    cgroupRoot,
    ctr,
    cgroup: (controller, qos, podUid, containerId) =>
      join("/sys/fs/cgroup", controller, cgroupRoot, "kubepods", qos === "guaranteed" ? "" : qos, `pod${podUid}`, containerId ?? ""),
    pids: () => procs.filter(running).map((p) => p.child.pid!),
    stop,
  };
}
