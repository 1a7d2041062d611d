// The chart installed into a real Kubernetes control plane (scripts/k8s-rig: etcd, kube-apiserver,
// controller-manager, scheduler; kwok plays the kubelets) with labelled nodes, and the project's
// own processes answering for the pods (scripts/k8s-rig/pod-runner.ts runs each container's
// command line from the rendered chart, bound to the pod's IP). Checks: pods land on the right
// nodes, the relay exists only when the transport needs it, a completion through the gateway pod's
// IP gives the tokens `airm up`'s launcher gives, an upgrade to nixl adds the NIXL agent to the PD
// pod, an upgrade to tcp moves the roles apart, and an uninstall leaves no process and no
// shared-memory folder.
import { execFileSync } from "node:child_process";
import { existsSync, readdirSync, rmSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { defaultNixlPython } from "../../packages/kv-nixl/src/index.ts";
import { makeTinyModel } from "../../packages/llama/src/index.ts";
import { startLocalCluster, type RunningCluster } from "../../packages/workload-runner/src/index.ts";
import { isReady, PodRunner } from "../../scripts/k8s-rig/pod-runner.ts";
import { chartCompletion, helm as runHelm } from "../../scripts/k8s-rig/release.ts";
import { type Rig, startRig } from "../../scripts/k8s-rig/rig.ts";

const repo = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const chart = join(repo, "charts", "rngd-pd");
const NS = "serving";
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

let rig: Rig;
let runner: PodRunner;
let helm: string;
let model: string;
let reference: RunningCluster;

const RNGD = "airm.ai-computing.io/furiosa.RNGD";
const ATOM = "airm.ai-computing.io/rebellions.ATOM";

async function helmRun(args: string[]): Promise<string> {
  try {
    return await runHelm(helm, [...args, "--kubeconfig", rig.kubeconfig, "--namespace", NS]);
  } catch (e) {
    throw new Error(`${(e as Error).message}\n${rigState()}`);
  }
}

/** What the rig holds when a wait fails: pods, recent events, and the last output of each pod's containers. */
function rigState(): string {
  const safe = (f: () => string) => {
    try {
      return f();
    } catch (e) {
      return (e as Error).message;
    }
  };
  const pods = safe(() => rig.kubectl(["get", "pods", "-A", "-o", "wide"]));
  const events = safe(() => rig.kubectl(["get", "events", "-A", "--sort-by=.lastTimestamp"]).split("\n").slice(-25).join("\n"));
  const logs = safe(() => runner.podLogs(1500));
  return `--- pods\n${pods}\n--- events\n${events}\n${logs}`;
}

/** Values every install here uses: the tiny model at its path on this host, no pool labels needed. */
const base = () => ["--set", `model.path=${model}`, "--set", "maxModelLen=128"];
/** `helm upgrade` of the release to the chart's example `example`, with more arguments, waiting for it. */
const upgrade = (example: string, ...more: string[]) =>
  helmRun(["upgrade", "rngd-pd", chart, ...base(), "-f", join(chart, "examples", example), ...more, "--wait", "--timeout", "120s"]);

/** name -> node name and labels of the release's pods. */
function placement(): { pod: string; component: string; node: string; labels: Record<string, string> }[] {
  const pods = JSON.parse(rig.kubectl(["get", "pods", "-n", NS, "-o", "json"])).items as any[];
  const nodes = JSON.parse(rig.kubectl(["get", "nodes", "-o", "json"])).items as any[];
  return pods
    .filter((p) => !p.metadata.deletionTimestamp)
    .map((p) => ({
      pod: p.metadata.name,
      component: p.metadata.labels["app.kubernetes.io/component"],
      node: p.spec.nodeName,
      labels: nodes.find((n) => n.metadata.name === p.spec.nodeName)?.metadata.labels ?? {},
    }));
}

async function until<T>(what: string, f: () => T | null | undefined | Promise<T | null | undefined>, ms = 60_000): Promise<T> {
  const end = Date.now() + ms;
  for (;;) {
    const v = await f();
    if (v) return v;
    if (Date.now() > end) throw new Error(`not within ${ms} ms: ${what}`);
    await sleep(250);
  }
}

/** The gateway pod's IP once its /health says every role is healthy. */
async function gatewayIp(component: string): Promise<string> {
  return until(
    `a healthy gateway in a ${component} pod`,
    async () => {
      const pod = placement().find((p) => p.component === component);
      const ip = pod && runner.pods.size ? [...runner.pods.values()].find((r) => r.name === pod.pod)?.ip : undefined;
      if (!ip) return null;
      const ok = await fetch(`http://${ip}:8000/health`).then(
        (r) => r.status === 200,
        () => false,
      );
      return ok ? ip : null;
    },
    120_000,
  ).catch((e: Error) => {
    const logs = placement()
      .map(
        (p) => `--- ${p.pod} (${p.component} on ${p.node})\n${["gateway", "prefill", "decode", "kv-relay", "nixl-agent"].map((c) => runner.logs(p.pod, c).slice(-1500)).join("")}`,
      )
      .join("\n");
    throw new Error(`${e.message}\n${logs}`);
  });
}

const completion = chartCompletion;

const shmLeft = () => readdirSync("/dev/shm").filter((f) => f.startsWith("airm-rig-"));

beforeAll(async () => {
  helm = execFileSync("bash", [join(repo, "scripts", "tools", "helm.sh")], { encoding: "utf8", stdio: ["ignore", "pipe", "inherit"] }).trim();
  model = join(repo, "node_modules", ".cache", `airm-k8s-tiny-${process.pid}`);
  makeTinyModel({ arch: "llama", out: model });
  reference = await startLocalCluster({ model, maxModelLen: 128, port: 0, prefill: [{ port: 0 }], decode: [{ port: 0 }] });
  rig = await startRig([
    { name: "npu-rngd", labels: { [RNGD]: "true" }, devices: { "furiosa.ai/rngd": 2 } },
    { name: "npu-atom", labels: { [ATOM]: "true" }, devices: { "rebellions.ai/ATOM": 2 } },
    { name: "npu-both", labels: { [RNGD]: "true", [ATOM]: "true" }, devices: { "furiosa.ai/rngd": 2, "rebellions.ai/ATOM": 2 } },
    { name: "cpu", labels: {} },
  ]);
  rig.kubectl(["create", "namespace", NS]);
  runner = new PodRunner(rig, repo, NS);
  runner.start();
}, 1_800_000);

afterAll(async () => {
  await runner?.stop();
  await rig?.stop();
  await reference?.stop();
  if (model) rmSync(model, { recursive: true, force: true });
});

describe("charts/rngd-pd on a real control plane", () => {
  test("default values (shm): one PD pod on the node with both cards; a completion through its IP gives airm up's tokens", async () => {
    await helmRun(["install", "rngd-pd", chart, ...base(), "--wait", "--timeout", "120s"]);
    const pods = placement();
    expect(pods.map((p) => p.component)).toEqual(["pd"]);
    expect(pods[0]!.node).toBe("npu-both");
    const ip = await gatewayIp("pd");
    const want = await completion(reference.url);
    expect(await completion(`http://${ip}:8000`)).toEqual(want);
    console.log(`default: ${pods.map((p) => `${p.pod} -> ${p.node}`).join(", ")}; tokens ${JSON.stringify(want)}`);
    // Nothing the rig or the pods run listens beyond loopback.
    const ours = new Set([...rig.pids(), ...runner.pids()]);
    const listening = execFileSync("ss", ["-ltnpH"], { encoding: "utf8" })
      .split("\n")
      .filter((l) => [...l.matchAll(/pid=(\d+)/g)].some((m) => ours.has(Number(m[1]))))
      .map((l) => l.trim().split(/\s+/)[3]!);
    expect(listening.length).toBeGreaterThan(5);
    expect(listening.filter((addr) => !addr.startsWith("127."))).toEqual([]);
  });

  test.skipIf(!existsSync(defaultNixlPython()))(
    "upgrade to nixl: the PD pod runs the NIXL agent beside its workers, which copy KV through it; same tokens through its gateway",
    async () => {
      await upgrade("nixl.yaml", "--set", `nixl.python=${defaultNixlPython()}`, "--set", "nixl.poolMb=64");
      const pods = placement();
      expect(pods.map((p) => p.component)).toEqual(["pd"]);
      expect(pods[0]!.node).toBe("npu-both");
      const ip = await gatewayIp("pd");
      expect(await completion(`http://${ip}:8000`)).toEqual(await completion(reference.url));
      expect(runner.logs(pods[0]!.pod, "nixl-agent")).toMatch(/listening on /);
      // the decode worker pulled over NIXL: its agent registered both workers' arenas
      expect(runner.logs(pods[0]!.pod, "nixl-agent")).toMatch(/arena 2 registered/);
    },
  );

  test("upgrade to tcp: prefill on an RNGD node, decode on an ATOM node, a relay; same tokens through the gateway pod", async () => {
    await upgrade("tcp.yaml");
    const pods = await until("the shm pod gone and five tcp pods (prefill, decode, relay, two gateways)", () => {
      const p = placement();
      return p.length === 5 && !p.some((x) => x.component === "pd") ? p : null;
    });
    expect(pods.filter((p) => p.component === "gateway").length).toBe(2);
    const by = (c: string) => pods.find((p) => p.component === c)!;
    expect(by("prefill").labels[RNGD]).toBe("true");
    expect(by("decode").labels[ATOM]).toBe("true");
    expect(by("kv-relay")).toBeDefined();
    const ip = await gatewayIp("gateway");
    expect(await completion(`http://${ip}:8000`)).toEqual(await completion(reference.url));
    console.log(`tcp: ${pods.map((p) => `${p.component} -> ${p.node}`).join(", ")}`);
  });

  test("rolling restarts of the decode Deployment under held-open load (tcp, two decode pods): every stream is answered whole, drained or moved", async () => {
    const decodes = () => placement().filter((p) => p.component === "decode");
    const podsReady = () => JSON.parse(rig.kubectl(["get", "pods", "-n", NS, "-l", "app.kubernetes.io/component=decode", "-o", "json"])).items.filter(isReady).length;
    /** Four clients, each sending its next streamed completion as soon as one ends, until stopped. */
    const hold = async (url: string) => {
      const model = ((await (await fetch(`${url}/v1/models`)).json()) as { data: { id: string }[] }).data[0]!.id;
      const o = { holding: true, whole: 0, failures: [] as string[], held: [] as Promise<void>[] };
      const holder = async (i: number) => {
        while (o.holding) {
          const r = await fetch(`${url}/v1/completions`, {
            method: "POST",
            headers: { "content-type": "application/json" },
            body: JSON.stringify({ model, prompt: `held ${i}`, max_tokens: 96, ignore_eos: true, temperature: 0, stream: true, stream_options: { include_usage: true } }),
          }).catch((e: Error) => e);
          if (r instanceof Error) {
            o.failures.push(`client ${i}: ${r.message}`);
            continue;
          }
          const text = await r.text();
          const usage = /"completion_tokens":(\d+)/.exec(text)?.[1];
          if (r.status !== 200 || text.includes('"error"') || !text.trimEnd().endsWith("data: [DONE]") || usage !== "96")
            o.failures.push(`client ${i}: ${r.status} ${text.slice(-300)}`);
          else o.whole++;
        }
      };
      o.held = [0, 1, 2, 3].map(holder);
      await until("the load running", () => o.whole >= 4 || null);
      return o;
    };
    /** `kubectl rollout restart` of decode under the load; resolves once two new pods are ready and the old ones' processes are gone. */
    const roll = async (o: { whole: number }) => {
      const old = new Set(decodes().map((p) => p.pod));
      rig.kubectl(["rollout", "restart", "deployment/rngd-pd-decode", "-n", NS]);
      await until(
        "the rollout done: two new decode pods ready, the old ones' processes gone",
        () => {
          const now = decodes();
          return (now.length === 2 && now.every((p) => !old.has(p.pod)) && podsReady() === 2 && ![...runner.pods.values()].some((p) => old.has(p.name))) || null;
        },
        180_000,
      );
      const after = o.whole;
      await until("more answers after the rollout", () => o.whole >= after + 4 || null);
    };
    const migrations = async (url: string) =>
      [...(await (await fetch(`${url}/metrics`)).text()).matchAll(/^airm_migrations_total\{[^}]*\} (\d+)$/gm)].reduce((a, m) => a + Number(m[1]), 0);

    // Defaults: the old pods drain (10 s); these short answers finish where they are.
    await upgrade("tcp.yaml", "--set", "decode.replicas=2");
    await until("two ready decode pods", () => (decodes().length === 2 && podsReady() === 2) || null);
    let url = `http://${await gatewayIp("gateway")}:8000`;
    let load = await hold(url);
    await roll(load);
    load.holding = false;
    await Promise.all(load.held);
    console.log(`rolling restart, drain 10 s: ${load.whole} whole answers, ${load.failures.length} failures, ${await migrations(url)} migrations`);
    expect(load.failures).toEqual([]);

    // airm.drainSeconds=0: the old pods hand their streams back at once, and the gateway moves them.
    await upgrade("tcp.yaml", "--set", "decode.replicas=2", "--set", "airm.drainSeconds=0");
    await until("two ready decode pods", () => (decodes().length === 2 && podsReady() === 2) || null);
    url = `http://${await gatewayIp("gateway")}:8000`;
    const before = await migrations(url);
    load = await hold(url);
    await roll(load);
    load.holding = false;
    await Promise.all(load.held);
    const moved = (await migrations(url)) - before;
    console.log(`rolling restart, drain 0 s: ${load.whole} whole answers, ${load.failures.length} failures, ${moved} migrations`);
    expect(load.failures).toEqual([]);
    // How many streams move depends on whether an old pod still had one when it stopped: 2 and 3 in
    // two CI runs, 0 in a third (short answers on the tiny model). Moving a cut stream is checked
    // deterministically by packages/workload-runner/test/e2e/migration.test.ts; here the count is
    // only reported, and every answer must be whole.
  });

  test("decode-on-RNGD override: the decode pod lands on an RNGD node and asks for no ATOM", async () => {
    await upgrade("tcp.yaml", "-f", join(chart, "examples", "decode-on-rngd.yaml"));
    const specOf = (pod: string) => JSON.parse(rig.kubectl(["get", "pod", pod, "-n", NS, "-o", "json"])).spec;
    // The new decode pod (one replica, maxSurge 0: the ATOM one goes first), on a node with RNGD cards.
    const decode = await until(
      "the rngd decode pod scheduled",
      () => placement().find((p) => p.component === "decode" && p.node && specOf(p.pod).containers[0].args.includes("rngd")) ?? null,
    );
    expect(decode.labels[RNGD]).toBe("true");
    const spec = specOf(decode.pod);
    expect(spec.containers[0].resources.limits).toEqual({ "furiosa.ai/rngd": "1" });
    expect(spec.nodeSelector).toEqual({ [RNGD]: "true" });
    // The gateway pod stayed; it uses the new decode pod once that one's process serves.
    await until(
      "the new decode pod serving",
      async () => {
        const ip = [...runner.pods.values()].find((r) => r.name === decode.pod)?.ip;
        return ip
          ? fetch(`http://${ip}:8102/health`).then(
              (r) => r.status === 200,
              () => false,
            )
          : false;
      },
      120_000,
    );
    const ip = await gatewayIp("gateway");
    expect(await completion(`http://${ip}:8000`)).toEqual(await completion(reference.url));
    console.log(
      `decode-on-rngd: ${placement()
        .map((p) => `${p.component} -> ${p.node}`)
        .join(", ")}`,
    );
  });

  test("the experiment sweep (airm k8s render of deploy/k8s/sweep-matrix.yaml) is valid for the API server", () => {
    const rendered = execFileSync(
      process.execPath,
      [join(repo, "packages", "workload-runner", "bin", "airm.mjs"), "k8s", "render", join(repo, "deploy", "k8s", "sweep-matrix.yaml")],
      {
        encoding: "utf8",
        env: { ...process.env, RNGD_PD_NODE: "npu-both", RNGD_PD_HOME: "/home/lab" },
      },
    );
    const out = rig.kubectl(["apply", "--dry-run=server", "-n", NS, "-f", "-"], rendered);
    expect(out.match(/created \(server dry run\)/g)?.length).toBe(8);
  });

  test("uninstall leaves no pod, no process and no shared-memory folder", async () => {
    const pids = runner.pids();
    expect(pids.length).toBeGreaterThan(0);
    await helmRun(["uninstall", "rngd-pd", "--wait", "--timeout", "120s"]);
    await until("every pod gone and its processes stopped", () => placement().length === 0 && runner.pids().length === 0);
    for (const pid of pids) expect(() => process.kill(pid, 0)).toThrow();
    expect(shmLeft()).toEqual([]);
  });
});
