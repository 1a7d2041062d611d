// Runs the processes of the rig's pods: for every pod kwok marks Running, each container's command
// line as the rendered chart wrote it (the image's /app mapped to this repository), bound to the
// pod's IP (kwok hands out 127.1.0.0/24, so a process on this host answers for the pod), with the
// container's environment. emptyDir volumes become per-pod folders (memory-backed ones under
// /dev/shm), a secret volume a per-pod folder holding the Secret's keys as files (read when the
// pod starts, as a kubelet writes them; no later updates), and the pod's own loopback and wildcard addresses become its IP. Services get what kube-proxy
// gives them: a stable address (127.2.0.0/24 here) whose ports forward each new connection to a
// running pod the Service selects, so `<svc>.<ns>.svc` keeps working when the pods behind it are
// replaced. A pod that goes away has its processes stopped and its folders removed. Pods on a node
// kwok does not manage (a real kubelet's, node.ts) are left to that kubelet. A signal to this
// process between start() and stop() kills every pod's processes at once and removes the pods'
// folders (../rig-cleanup.ts).
import { type ChildProcess, spawn } from "node:child_process";
import { mkdirSync, rmSync, writeFileSync } from "node:fs";
import { connect, createServer, type Server } from "node:net";
import { join } from "node:path";
import { killTrees, onInterrupt } from "../rig-cleanup.ts";
import { KWOK_NODE, type Rig } from "./rig.ts";

/** A Kubernetes object as kubectl prints it, read field by field. */
// biome-ignore lint/suspicious/noExplicitAny: objects of every kind, read field by field
type Obj = any;

interface RunningPod {
  uid: string;
  name: string;
  ip: string;
  /** What its readiness probes said last (the pod's Ready condition is patched to follow it). */
  ready: boolean;
  /** Seconds its processes get after SIGTERM (terminationGracePeriodSeconds, default 30). */
  graceS: number;
  procs: { container: string; child: ChildProcess; log: string[]; preStopS: number }[];
  dirs: string[];
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Whether a pod is Running with its Ready condition True. */
export function isReady(pod: Obj): boolean {
  return pod.status?.phase === "Running" && (pod.status?.conditions ?? []).some((c: Obj) => c.type === "Ready" && c.status === "True");
}

export class PodRunner {
  readonly pods = new Map<string, RunningPod>();
  /** Processes of pods being stopped (they count as running until they exit). */
  private readonly stopping = new Set<ChildProcess>();
  /** Service (name.namespace) -> its stable address and the port forwarders listening there. */
  private readonly services = new Map<string, { ip: string; ports: string; servers: Server[] }>();
  private podList: Obj[] = [];
  /** The Services as last listed, by name.namespace. */
  private readonly serviceSpecs = new Map<string, Obj>();
  private nextService = 1;
  /** Node name -> whether kwok manages it (its pods are ours to run); filled as pods name nodes. */
  private readonly kwokNodes = new Map<string, boolean>();
  private stopped = false;
  private loop: Promise<void> | null = null;
  /** The last error of the sync-and-probe loop (a failed kubectl call), for failure messages. */
  private lastError = "";
  /** Turns of the sync-and-probe loop so far (a stuck loop shows in failure messages). */
  private turns = 0;
  /** IPs of pods whose processes are being stopped (a new pod given one of them waits). */
  private readonly stoppingIps = new Set<string>();
  /** Every folder made for a pod (a pod being stopped is no longer in `pods` but may still have its folders). */
  private readonly madeDirs = new Set<string>();
  /** Unregisters the teardown start() registered. */
  private forget = () => {};

  constructor(
    private readonly rig: Rig,
    private readonly repo: string,
    private readonly namespace: string,
  ) {}

  start(): void {
    this.forget = onInterrupt(() => this.kill());
    this.loop = (async () => {
      while (!this.stopped) {
        try {
          this.turns++;
          this.sync();
          await this.probeAll();
        } catch (err) {
          // the API may be busy for a moment (helm applying); try again (shown by podLogs())
          this.lastError = `${new Date().toISOString()} ${(err as Error).message.slice(0, 600)}`;
        }
        await sleep(300);
      }
    })();
  }

  /** Output lines of a pod's container (for failure messages). */
  logs(pod: string, container: string): string {
    const p = [...this.pods.values()].find((x) => x.name === pod);
    return p?.procs.find((c) => c.container === container)?.log.join("") ?? "";
  }

  /** The last output of every pod's processes, `chars` per container (for failure messages). */
  podLogs(chars = 1200): string {
    const pods = [...this.pods.values()].map(
      (p) => `--- ${p.name} ${p.ip} (probes say ${p.ready ? "ready" : "not ready"})\n${p.procs.map((c) => `[${c.container}] ${c.log.join("").slice(-chars)}`).join("\n")}`,
    );
    return [...pods, `--- pod runner: ${this.turns} turns; last error: ${this.lastError || "none"}`].join("\n");
  }

  /** Pids of every process the runner has started that has not exited yet. */
  pids(): number[] {
    const alive = (c: ChildProcess) => c.exitCode === null && c.signalCode === null;
    return [...[...this.pods.values()].flatMap((p) => p.procs.map((c) => c.child)), ...this.stopping].filter(alive).map((c) => c.pid!);
  }

  async stop(): Promise<void> {
    this.stopped = true;
    await this.loop;
    for (const p of [...this.pods.values()]) await this.stopPod(p);
    for (const svc of this.services.values()) for (const srv of svc.servers) srv.close();
    this.services.clear();
    this.forget();
  }

  /** The teardown on a signal: kills every pod's processes (and their children) at once and removes the pods' folders. */
  private kill(): void {
    this.stopped = true;
    killTrees(this.pids());
    for (const d of this.madeDirs) rmSync(d, { recursive: true, force: true });
  }

  private sync(): void {
    const list = JSON.parse(this.rig.kubectl(["get", "pods", "-n", this.namespace, "-o", "json"])) as { items: Obj[] };
    const services = JSON.parse(this.rig.kubectl(["get", "services", "-n", this.namespace, "-o", "json"])) as { items: Obj[] };
    this.podList = list.items;
    this.syncServices(services.items);
    const running = list.items.filter((pod) => pod.status?.phase === "Running" && pod.status?.podIP && !pod.metadata.deletionTimestamp && this.onKwokNode(pod));
    const live = new Set<string>(running.map((pod) => pod.metadata.uid as string));
    // Pods gone first: their IPs count as in use from now on (stopPod marks them at once).
    for (const p of [...this.pods.values()]) if (!live.has(p.uid)) void this.stopPod(p);
    for (const pod of running) {
      if (this.pods.has(pod.metadata.uid)) continue;
      // kwok hands a deleted pod's IP out again at once; a kubelet does not while the old pod's
      // processes still run (its preStop pause, its drain). The new pod starts once they are gone.
      if (this.stoppingIps.has(pod.status.podIP)) continue;
      const resolved = this.resolver(list.items, services.items);
      const cmds = (pod.spec.containers as Obj[]).map((c) => this.commandOf(pod, c, resolved));
      if (cmds.some((c) => c === null)) continue; // a Service it needs has no pod yet
      this.startPod(pod, cmds as Cmd[]);
    }
  }

  /** Whether the pod's node is one of kwok's (lists the nodes again when it names one not seen yet). */
  private onKwokNode(pod: Obj): boolean {
    const node = pod.spec?.nodeName as string | undefined;
    if (!node) return false;
    if (!this.kwokNodes.has(node)) {
      const nodes = JSON.parse(this.rig.kubectl(["get", "nodes", "-o", "json"])) as { items: Obj[] };
      for (const n of nodes.items) this.kwokNodes.set(n.metadata.name, n.metadata.annotations?.[KWOK_NODE[0]] === KWOK_NODE[1]);
    }
    return this.kwokNodes.get(node) ?? false;
  }

  /** A ready pod the Service selects, at random, or undefined (kube-proxy sends only to ready endpoints). */
  private podOf(svc: Obj, pods: Obj[]): Obj | undefined {
    const sel = Object.entries(svc.spec.selector ?? {});
    const ready = pods.filter((p) => isReady(p) && p.status?.podIP && !p.metadata.deletionTimestamp && sel.every(([k, v]) => p.metadata.labels?.[k] === v));
    return ready[Math.floor(Math.random() * ready.length)];
  }

  /**
   * Runs every started pod's readiness probes (httpGet, tcpSocket; grpc as a TCP connect) against
   * its processes, as the kubelet would, and patches the pod's Ready condition when the answer
   * changed: a pod is ready when each container is running and its probe (if any) passes.
   */
  private async probeAll(): Promise<void> {
    await Promise.all(
      [...this.pods.values()].map(async (p) => {
        const pod = this.podList.find((x) => x.metadata.uid === p.uid);
        if (!pod || pod.metadata.deletionTimestamp) return;
        const ready = (await Promise.all((pod.spec.containers as Obj[]).map((c) => this.probe(p, pod, c)))).every(Boolean);
        if (ready === p.ready && isReady(pod) === ready) return;
        p.ready = ready;
        const status = ready ? "True" : "False";
        const now = new Date().toISOString();
        const patch = {
          status: {
            conditions: [
              { type: "Ready", status, lastTransitionTime: now },
              { type: "ContainersReady", status, lastTransitionTime: now },
            ],
          },
        };
        this.rig.kubectl(["patch", "pod", pod.metadata.name, "-n", this.namespace, "--subresource=status", "--type=strategic", "-p", JSON.stringify(patch)]);
        pod.status.conditions = [...(pod.status.conditions ?? []).filter((c: Obj) => c.type !== "Ready" && c.type !== "ContainersReady"), ...patch.status.conditions];
      }),
    );
  }

  private async probe(p: RunningPod, pod: Obj, c: Obj): Promise<boolean> {
    const proc = p.procs.find((x) => x.container === c.name);
    if (!proc || proc.child.exitCode !== null || proc.child.signalCode !== null) return false;
    const r = c.readinessProbe;
    if (!r) return true;
    if (r.httpGet) {
      const port = this.targetPort(pod, r.httpGet.port);
      try {
        const res = await fetch(`http://${p.ip}:${port}${r.httpGet.path ?? "/"}`, { signal: AbortSignal.timeout(1000) });
        await res.arrayBuffer();
        return res.status >= 200 && res.status < 400;
      } catch {
        return false;
      }
    }
    const port = this.targetPort(pod, (r.tcpSocket ?? r.grpc)?.port);
    if (port === undefined) return true;
    return new Promise<boolean>((resolve) => {
      const sock = connect(port, p.ip);
      sock.setTimeout(1000);
      sock.once("connect", () => {
        sock.destroy();
        resolve(true);
      });
      sock.once("error", () => resolve(false));
      sock.once("timeout", () => {
        sock.destroy();
        resolve(false);
      });
    });
  }

  /** `<svc>.<ns>.svc` -> the Service's stable address, or null while no pod of it runs (a process started then would fail to connect). */
  private resolver(pods: Obj[], services: Obj[]): (host: string) => string | null {
    return (host) => {
      const [name, ns] = host.split(".");
      const svc = services.find((s) => s.metadata.name === name && s.metadata.namespace === ns);
      if (!svc || !this.podOf(svc, pods) || !this.services.has(`${name}.${ns}`)) return null;
      return this.services.get(`${name}.${ns}`)!.ip;
    };
  }

  /** Gives each new Service an address and forwarders for its ports; closes those of Services gone. */
  private syncServices(services: Obj[]): void {
    const seen = new Set<string>();
    for (const svc of services) {
      const key = `${svc.metadata.name}.${svc.metadata.namespace}`;
      seen.add(key);
      this.serviceSpecs.set(key, svc);
      if (!svc.spec.selector) continue;
      // An upgrade may change a Service's ports: its listeners follow, on the same address.
      const ports = (svc.spec.ports as Obj[]).map((x) => x.port).join(",");
      const had = this.services.get(key);
      if (had?.ports === ports) continue;
      for (const srv of had?.servers ?? []) srv.close();
      const ip = had?.ip ?? `127.2.0.${this.nextService++}`;
      const servers = (svc.spec.ports as Obj[]).map((port) => {
        const srv = createServer((sock) => {
          // The Service as it is now (an upgrade may have changed its selector).
          const pod = this.podOf(this.serviceSpecs.get(key) ?? svc, this.podList);
          const target = pod ? this.targetPort(pod, port.targetPort ?? port.port) : undefined;
          if (!pod || target === undefined) return void sock.destroy();
          const up = connect(target, pod.status.podIP);
          sock.pipe(up).pipe(sock);
          up.on("error", () => sock.destroy());
          sock.on("error", () => up.destroy());
        });
        srv.on("error", () => {});
        srv.listen(port.port, ip);
        return srv;
      });
      this.services.set(key, { ip, ports, servers });
    }
    for (const [key, svc] of [...this.services]) {
      if (seen.has(key)) continue;
      for (const srv of svc.servers) srv.close();
      this.services.delete(key);
      this.serviceSpecs.delete(key);
    }
  }

  /** A Service port's target on a pod: a number, or a container port's name. */
  private targetPort(pod: Obj, target: number | string): number | undefined {
    if (typeof target === "number") return target;
    for (const c of pod.spec.containers as Obj[]) for (const p of c.ports ?? []) if (p.name === target) return p.containerPort;
    return undefined;
  }

  private commandOf(pod: Obj, c: Obj, resolve: (host: string) => string | null): Cmd | null {
    const ip = pod.status.podIP as string;
    const uid = pod.metadata.uid as string;
    // emptyDir and secret volumes as per-pod folders, at the paths the containers mount them.
    const mounts: [string, string][] = [];
    for (const m of c.volumeMounts ?? []) {
      const vol = (pod.spec.volumes as Obj[]).find((v) => v.name === m.name);
      if (vol?.secret) {
        const dir = this.secretFolder(pod, vol.secret.secretName as string, `/tmp/airm-rig-${uid}-${m.name}`);
        if (dir === null) return null;
        mounts.push([m.mountPath, dir]);
        continue;
      }
      // A scratch /tmp stays the host's /tmp (the processes use it as their own; nothing the chart
      // passes lives there, while host paths given to the test, such as its model, may).
      if (!vol?.emptyDir || m.mountPath === "/tmp") continue;
      const base = vol.emptyDir.medium === "Memory" ? "/dev/shm" : "/tmp";
      mounts.push([m.mountPath, join(base, `airm-rig-${uid}-${m.name}`)]);
    }
    let unresolved = false;
    const map = (s: string): string => {
      // A wildcard bind (0.0.0.0, ZMQ's tcp://*:port) in a pod binds only that pod's addresses.
      let out = s
        .replace(/\b0\.0\.0\.0\b/g, ip)
        .replace(/\b127\.0\.0\.1\b/g, ip)
        .replace(/tcp:\/\/\*:/g, `tcp://${ip}:`);
      out = out.replace(/\b([a-z0-9-]+\.[a-z0-9-]+)\.svc\b/g, (host: string) => {
        const to = resolve(host);
        if (to === null) unresolved = true;
        return to ?? host;
      });
      for (const [from, to] of mounts) if (out === from || out.startsWith(`${from}/`)) out = to + out.slice(from.length);
      return out;
    };
    const command = (c.command as string[]).map((x, i) => (i === 0 && x === "node" ? process.execPath : x.startsWith("/app/") ? join(this.repo, x.slice(5)) : x));
    const args = (c.args ?? []).map((a: string) => map(String(a)));
    const env: Record<string, string> = { PATH: process.env.PATH ?? "/usr/bin:/bin", HOME: process.env.HOME ?? "/tmp" };
    for (const e of c.env ?? []) {
      if (e.valueFrom?.fieldRef?.fieldPath === "metadata.uid") env[e.name] = uid;
      else if (e.valueFrom?.fieldRef?.fieldPath === "status.podIP") env[e.name] = ip;
      else if (e.valueFrom?.fieldRef?.fieldPath === "metadata.namespace") env[e.name] = pod.metadata.namespace;
      else env[e.name] = map(String(e.value ?? ""));
    }
    if (unresolved) return null;
    // A pod with a service account reaches the API server as a kubelet would let it (a mounted
    // token); here the process gets the rig's kubeconfig instead (its RBAC is not exercised).
    if (pod.spec.serviceAccountName && pod.spec.automountServiceAccountToken !== false) env.KUBECONFIG = this.rig.kubeconfig;
    const preStopS = Number(c.lifecycle?.preStop?.sleep?.seconds ?? 0);
    return { container: c.name, argv: [...command, ...args], env, dirs: mounts.map(([, to]) => to), preStopS };
  }

  /** The Secret's keys written as files into `dir` (a kubelet's secret volume); null while the Secret does not exist (the pod waits, as a kubelet's would). */
  private secretFolder(pod: Obj, name: string, dir: string): string | null {
    let secret: Obj;
    try {
      secret = JSON.parse(this.rig.kubectl(["get", "secret", name, "-n", pod.metadata.namespace, "-o", "json"]));
    } catch {
      return null;
    }
    mkdirSync(dir, { recursive: true, mode: 0o700 });
    this.madeDirs.add(dir);
    for (const [key, b64] of Object.entries(secret.data ?? {})) writeFileSync(join(dir, key), Buffer.from(String(b64), "base64"), { mode: 0o600 });
    return dir;
  }

  private startPod(pod: Obj, cmds: Cmd[]): void {
    const p: RunningPod = {
      uid: pod.metadata.uid,
      name: pod.metadata.name,
      ip: pod.status.podIP,
      ready: false,
      graceS: pod.spec.terminationGracePeriodSeconds ?? 30,
      procs: [],
      dirs: [...new Set(cmds.flatMap((c) => c.dirs))],
    };
    for (const d of p.dirs) {
      mkdirSync(d, { recursive: true });
      this.madeDirs.add(d);
    }
    this.pods.set(p.uid, p);
    for (const c of cmds) this.spawnContainer(p, c, []);
  }

  /**
   * Starts one container's process; when it exits while its pod is still running it is started
   * again a second later, as the kubelet does with restartPolicy Always (a worker that started
   * before the relay it needs was listening exits, and comes back).
   */
  private spawnContainer(p: RunningPod, c: Cmd, log: string[]): void {
    const child = spawn(c.argv[0]!, c.argv.slice(1), { env: c.env, stdio: ["ignore", "pipe", "pipe"] });
    const keep = (b: Buffer) => {
      log.push(b.toString());
      if (log.length > 300) log.shift();
    };
    child.stdout?.on("data", keep);
    child.stderr?.on("data", keep);
    const entry = { container: c.container, child, log, preStopS: c.preStopS };
    const at = p.procs.findIndex((x) => x.container === c.container);
    if (at >= 0) p.procs[at] = entry;
    else p.procs.push(entry);
    child.once("exit", (code, signal) => {
      if (this.stopped || this.pods.get(p.uid) !== p) return;
      log.push(`[pod-runner] ${c.container} exited (${code ?? signal}); restarting in 1 s\n`);
      setTimeout(() => {
        if (!this.stopped && this.pods.get(p.uid) === p) this.spawnContainer(p, c, log);
      }, 1000);
    });
  }

  /**
   * Stops a pod as the kubelet does: each container's preStop sleep hook first (the container keeps
   * serving meanwhile), then SIGTERM, and SIGKILL for whatever still runs when the grace period
   * (which the hooks count against) is over.
   */
  private async stopPod(p: RunningPod): Promise<void> {
    this.pods.delete(p.uid);
    this.stoppingIps.add(p.ip);
    for (const c of p.procs) this.stopping.add(c.child);
    const until = Date.now() + p.graceS * 1000;
    await Promise.all(
      p.procs.map(async (c) => {
        if (!this.stopped) await sleep(Math.min(c.preStopS * 1000, until - Date.now()));
        if (c.child.exitCode === null) c.child.kill("SIGTERM");
      }),
    );
    while (p.procs.some((c) => c.child.exitCode === null && c.child.signalCode === null) && Date.now() < until) await sleep(100);
    for (const c of p.procs) if (c.child.exitCode === null && c.child.signalCode === null) c.child.kill("SIGKILL");
    while (p.procs.some((c) => c.child.exitCode === null && c.child.signalCode === null)) await sleep(50);
    for (const d of p.dirs) rmSync(d, { recursive: true, force: true });
    for (const c of p.procs) this.stopping.delete(c.child);
    this.stoppingIps.delete(p.ip);
  }
}

interface Cmd {
  container: string;
  argv: string[];
  env: Record<string, string>;
  dirs: string[];
  /** Seconds of the container's `lifecycle.preStop.sleep` hook (0: none). */
  preStopS: number;
}
