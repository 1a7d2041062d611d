// The Helm chart charts/rngd-pd with the real helm (v3.22.0, built once by scripts/tools/helm.sh):
// lint with several value sets, golden renders, schema errors that name the key, and what the
// renders must hold (pods on the right nodes, the relay only when the transport needs it, the
// device-plugin checkpoint and POD_UID for --chip -1, the ATOM map-merge trap, every variable the
// chart sets declared by the code). Installing into a control plane is not done here yet.
import { spawnSync } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { beforeAll, describe, expect, test } from "vitest";
import { declaredVariables } from "../scripts/gen-docs.ts";
import { helmBinary, type Manifest, manifests as manifestsOf, render as renderChart } from "./chart-render.ts";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const chart = join(root, "charts", "rngd-pd");
const example = (name: string) => join(chart, "examples", `${name}.yaml`);
const golden = (name: string) => join(chart, "test", "golden", `${name}.yaml`);
let helm = "";
const render = (files: string[] = [], set: string[] = []) => renderChart(helm, files, set);
const manifests = (files: string[] = [], set: string[] = []): Manifest[] => manifestsOf(helm, files, set);

beforeAll(() => {
  helm = helmBinary();
}, 1_200_000);

const deployment = (ms: Manifest[], suffix: string) => ms.find((m) => m.kind === "Deployment" && m.metadata.name === `rngd-pd-${suffix}`);
const container = (d: Manifest, name: string) => d.spec.template.spec.containers.find((c: Manifest) => c.name === name);
const envOf = (c: Manifest) => Object.fromEntries((c.env ?? []).map((e: Manifest) => [e.name, e.value ?? e.valueFrom]));
const arg = (c: Manifest, flag: string) => c.args[c.args.indexOf(flag) + 1];

const VALUE_SETS: Record<string, string[]> = {
  default: [],
  tcp: [example("tcp")],
  nixl: [example("nixl")],
  "decode-on-rngd": [example("decode-on-rngd")],
  "llm-d-sidecar": [example("llm-d-sidecar")],
};

describe("charts/rngd-pd", () => {
  test("helm lint passes with the defaults and every example override, alone and combined", () => {
    const sets = [
      [],
      [example("tcp")],
      [example("nixl")],
      [example("decode-on-rngd")],
      [example("site.example")],
      [example("llm-d-sidecar")],
      [example("tcp"), example("decode-on-rngd"), example("site.example")],
    ];
    for (const files of sets) {
      const r = spawnSync(helm, ["lint", chart, ...files.flatMap((f) => ["-f", f])], { encoding: "utf8" });
      expect(r.status, `${files.join(" ")}\n${r.stdout}${r.stderr}`).toBe(0);
    }
    const nixl = spawnSync(helm, ["lint", chart, "--set", "airm.kvTransport=nixl-ucx"], { encoding: "utf8" });
    expect(nixl.status, nixl.stdout).toBe(0);
    const hostPathMode = spawnSync(helm, ["lint", chart, "-f", example("hostpath-repo.example")], { encoding: "utf8" });
    expect(hostPathMode.status, hostPathMode.stdout).toBe(0);
  });

  test("renders match the committed goldens (UPDATE_GOLDEN=1 rewrites them)", () => {
    for (const [name, files] of Object.entries(VALUE_SETS)) {
      const r = render(files);
      expect(r.ok, r.err).toBe(true);
      if (process.env.UPDATE_GOLDEN === "1") {
        mkdirSync(dirname(golden(name)), { recursive: true });
        writeFileSync(golden(name), r.out);
      }
      expect(existsSync(golden(name)), `missing ${golden(name)}: run with UPDATE_GOLDEN=1`).toBe(true);
      expect(r.out, `render of ${name} differs from its golden`).toBe(readFileSync(golden(name), "utf8"));
    }
  });

  test("bad values are refused with a message naming the key", () => {
    const cases: [string[], RegExp][] = [
      [["airm.kvTransport=rdma"], /\/airm\/kvTransport.*one of 'shm', 'nixl', 'tcp', 'nixl-ucx'/],
      [["maxModelLen=abc"], /\/maxModelLen.*want/],
      [["maxModelLen=4"], /\/maxModelLen.*minimum/],
      [["seqLen=512"], /additional properties 'seqLen' not allowed/],
      [["kvCache.blockSize=12"], /\/kvCache\/blockSize/],
      [["kvCache.memory=lots"], /\/kvCache\/memory/],
      [["decode.bogus=1"], /\/decode.*'bogus' not allowed/],
      [["decode.backend=rngd-full"], /\/decode\/backend/],
      [["decode.batch=0"], /\/decode\/batch/],
      [["model.path=models/m"], /\/model\/path/],
      [["image.mode=docker"], /\/image\/mode/],
      [["prefill.port=70000"], /\/prefill\/port/],
      [["inferencePool.endpointPickerRef.failureMode=Maybe"], /\/inferencePool\/endpointPickerRef\/failureMode/],
      [["topology=mesh"], /\/topology.*one of 'gateway', 'sidecar'/],
      [["topology=sidecar"], /topology sidecar needs airm.kvTransport tcp or nixl-ucx/],
      [["epp.replicas=0"], /\/epp\/replicas/],
      [["nixl.python=venv/bin/python"], /\/nixl\/python/],
      [["airm.kvTransport=nixl", "topology=sidecar"], /topology sidecar needs airm.kvTransport tcp or nixl-ucx/],
      [["epp.routing=kv"], /\/epp\/routing.*one of 'approx-prefix', 'prefix', 'load', 'random'/],
      [["epp.enabled=true", "kvEvents.enabled=false"], /epp.routing prefix follows the workers' KV events: set kvEvents.enabled true/],
      [["kvEvents.port=0"], /\/kvEvents\/port/],
    ];
    for (const [set, message] of cases) {
      const r = render([], set);
      expect(r.ok, set.join(" ")).toBe(false);
      expect(r.err).toMatch(message);
    }
    const noRepo = render([], ["image.mode=hostPath"]);
    expect(noRepo.ok).toBe(false);
    expect(noRepo.err).toContain("image.repoHostPath is required");
  });

  test("llm-d's sidecar topology: the pool selects prefill pods (worker on the target port) and decode pods with the gateway as sidecar; our picker behind endpointPickerRef", () => {
    const ms = manifests([example("llm-d-sidecar")]);
    expect(ms.filter((m) => m.kind === "Deployment").map((m) => m.metadata.name)).toEqual(["rngd-pd-epp", "rngd-pd-prefill", "rngd-pd-decode", "rngd-pd-kv-relay"]);
    const prefill = deployment(ms, "prefill");
    const decode = deployment(ms, "decode");
    const pool = ms.find((m) => m.kind === "InferencePool");
    const port = pool.spec.targetPorts[0].number;
    for (const [d, role] of [
      [prefill, "prefill"],
      [decode, "decode"],
    ]) {
      const labels = d.spec.template.metadata.labels;
      expect(labels["llm-d.ai/role"]).toBe(role);
      // Selected by the pool: every selector label is on the pod.
      for (const [k, v] of Object.entries(pool.spec.selector.matchLabels)) expect(labels[k], k).toBe(v);
    }
    expect(arg(container(prefill, "prefill"), "--port")).toBe(String(port));
    expect(decode.spec.template.spec.containers.map((c: Manifest) => c.name)).toEqual(["decode", "gateway"]);
    const gw = container(decode, "gateway");
    expect(arg(gw, "--port")).toBe(String(port));
    expect(arg(gw, "--prefill-pool")).toBe(pool.metadata.name);
    expect(arg(gw, "--decode")).toBe("http://127.0.0.1:8102");
    expect(gw.args).not.toContain("--prefill");
    // A request the picker names no prefill pod for is prefilled by the decode worker (llm-d's sidecar behaviour).
    expect(gw.args).toContain("--local-prefill");
    // the picker decides where a request runs; the sidecar follows its header
    expect(gw.args.slice(gw.args.indexOf("--disaggregation"), gw.args.indexOf("--disaggregation") + 2)).toEqual(["--disaggregation", "header"]);
    expect(container(decode, "decode").args).toContain("--local-prefill");
    expect(container(prefill, "prefill").args).not.toContain("--local-prefill");
    expect(envOf(gw).POD_NAMESPACE).toEqual({ fieldRef: { fieldPath: "metadata.namespace" } });
    // The sidecar and the picker read the pool with a service account allowed only that.
    const sa = decode.spec.template.spec.serviceAccountName;
    const epp = deployment(ms, "epp");
    expect(epp.spec.template.spec.serviceAccountName).toBe(sa);
    const role = ms.find((m) => m.kind === "Role");
    expect(role.rules.flatMap((r: Manifest) => r.verbs)).not.toContain("create");
    expect(ms.find((m) => m.kind === "RoleBinding").subjects[0].name).toBe(sa);
    const e = container(epp, "epp");
    expect([arg(e, "--pool-name"), arg(e, "--pool-namespace"), arg(e, "--grpc-port"), arg(e, "--disaggregation"), arg(e, "--local-prefill-max-tokens")]).toEqual([
      pool.metadata.name,
      "serving",
      String(pool.spec.endpointPickerRef.port.number),
      "auto",
      "0",
    ]);
    const svc = ms.find((m) => m.kind === "Service" && m.metadata.name === pool.spec.endpointPickerRef.name);
    expect(svc.spec.selector["app.kubernetes.io/component"]).toBe("epp");
    // No gateway Deployment; the release's Service reaches the decode pods' gateways.
    expect(deployment(ms, "gateway")).toBeUndefined();
    expect(ms.find((m) => m.kind === "Service" && m.metadata.name === "rngd-pd").spec.selector["app.kubernetes.io/component"]).toBe("decode");
  });

  test("shm (default): one pod per PD unit with prefill, decode and a gateway, sharing a memory volume, on a node with both cards", () => {
    const ms = manifests();
    expect(ms.filter((m) => m.kind === "Deployment").map((m) => m.metadata.name)).toEqual(["rngd-pd-pd"]);
    expect(ms.some((m) => m.metadata.name.includes("kv-relay"))).toBe(false);
    const pd = deployment(ms, "pd");
    expect(pd.spec.strategy).toEqual({ type: "RollingUpdate", rollingUpdate: { maxSurge: 0, maxUnavailable: 1 } });
    const pod = pd.spec.template.spec;
    expect(pod.nodeSelector).toEqual({ "airm.ai-computing.io/furiosa.RNGD": "true", "airm.ai-computing.io/rebellions.ATOM": "true" });
    expect(pod.containers.map((c: Manifest) => c.name)).toEqual(["prefill", "decode", "gateway"]);
    expect(pod.volumes.find((v: Manifest) => v.name === "kv-shm").emptyDir.medium).toBe("Memory");
    for (const role of ["prefill", "decode"]) {
      const c = container(pd, role);
      const env = envOf(c);
      expect(env.AIRM_KV_TRANSPORT).toBe("shm");
      expect(c.volumeMounts.find((m: Manifest) => m.name === "kv-shm").mountPath).toBe(env.PD_SHM_ROOT);
      expect(env.AIRM_KV_TCP_ADDR).toBeUndefined();
    }
    expect(container(pd, "prefill").resources.limits).toEqual({ "furiosa.ai/rngd": 1 });
    expect(container(pd, "decode").resources.limits).toEqual({ "rebellions.ai/ATOM": 1 });
    expect(arg(container(pd, "decode"), "--backend")).toBe("atom");
    const gw = container(pd, "gateway");
    expect([arg(gw, "--prefill"), arg(gw, "--decode")]).toEqual(["http://127.0.0.1:8101", "http://127.0.0.1:8102"]);
    // The pool's labels go on the serving pods; the gateway's metrics are scraped by annotation.
    expect(pd.spec.template.metadata.labels["llm-d.ai/inferenceServing"]).toBe("true");
    expect(pd.spec.template.metadata.annotations["airm.ai-computing.io/scrape"]).toBe("true");
    expect(envOf(gw).AIRM_METRICS_PORT).toBe("9400");
  });

  test("kvEvents (on by default): vLLM's --kv-events-config on the pod's ports 5557/5558 (a PD pod's decode worker; both roles in pods of their own); our picker follows them (routing prefix)", () => {
    const config = (c: Manifest) => (envOf(c).AIRM_KV_EVENTS_CONFIG === undefined ? undefined : JSON.parse(envOf(c).AIRM_KV_EVENTS_CONFIG));
    const off = deployment(manifests([], ["kvEvents.enabled=false"]), "pd");
    for (const role of ["prefill", "decode"]) expect(config(container(off, role))).toBeUndefined();
    // On by default, and the picker routes by them.
    const on = manifests([], ["epp.enabled=true"]);
    const pd = deployment(on, "pd");
    expect(config(container(pd, "prefill"))).toBeUndefined();
    expect(config(container(pd, "decode"))).toEqual({ enable_kv_cache_events: true, publisher: "zmq", endpoint: "tcp://*:5557", replay_endpoint: "tcp://*:5558" });
    expect(container(pd, "decode").ports.map((p: Manifest) => p.containerPort)).toEqual([8102, 5557, 5558]);
    const epp = container(deployment(on, "epp"), "epp");
    expect([arg(epp, "--routing"), arg(epp, "--kv-events-port"), arg(epp, "--kv-replay-port")]).toEqual(["prefix", "5557", "5558"]);
    const approx = container(deployment(manifests([], ["epp.enabled=true", "kvEvents.enabled=false", "epp.routing=approx-prefix"]), "epp"), "epp");
    expect([arg(approx, "--routing"), approx.args.includes("--kv-events-port")]).toEqual(["approx-prefix", false]);
    const split = manifests([example("llm-d-sidecar")], ["kvEvents.port=6557", "kvEvents.replayPort=6558"]);
    for (const role of ["prefill", "decode"]) {
      const c = deployment(split, role).spec.template.spec.containers.find((x: Manifest) => x.name === role);
      expect(config(c)?.endpoint, role).toBe("tcp://*:6557");
    }
  });

  test("tcp: prefill on RNGD nodes, decode on ATOM nodes, a relay on any node, its address given to both workers", () => {
    const ms = manifests([example("tcp")]);
    expect(
      ms
        .filter((m) => m.kind === "Deployment")
        .map((m) => m.metadata.name)
        .sort(),
    ).toEqual(["rngd-pd-decode", "rngd-pd-gateway", "rngd-pd-kv-relay", "rngd-pd-prefill"]);
    const prefill = deployment(ms, "prefill");
    const decode = deployment(ms, "decode");
    expect(prefill.spec.template.spec.nodeSelector).toEqual({ "airm.ai-computing.io/furiosa.RNGD": "true" });
    expect(decode.spec.template.spec.nodeSelector).toEqual({ "airm.ai-computing.io/rebellions.ATOM": "true" });
    expect(deployment(ms, "kv-relay").spec.template.spec.nodeSelector ?? {}).toEqual({});
    const relaySvc = ms.find((m) => m.kind === "Service" && m.metadata.name === "rngd-pd-kv-relay");
    expect(relaySvc.spec.ports[0].port).toBe(7400);
    for (const d of [prefill, decode]) {
      const env = envOf(d.spec.template.spec.containers[0]);
      expect(env.AIRM_KV_TRANSPORT).toBe("tcp");
      expect(env.AIRM_KV_TCP_ADDR).toBe("rngd-pd-kv-relay.serving.svc:7400");
      expect(env.PD_SHM_ROOT).toBeUndefined();
    }
    const gw = container(deployment(ms, "gateway"), "gateway");
    expect(arg(gw, "--prefill")).toBe("http://rngd-pd-prefill.serving.svc:8101");
    expect(deployment(ms, "gateway").spec.template.metadata.labels["llm-d.ai/inferenceServing"]).toBe("true");
  });

  test("stopping well: two gateway pods (tcp) replaced new-first, a disruption budget per serving role, a preStop pause on every serving container, and a grace period covering pause + drain", () => {
    const budgets = (ms: Manifest[]) =>
      ms
        .filter((m) => m.kind === "PodDisruptionBudget")
        .map((m) => [m.metadata.name, m.spec.maxUnavailable, m.spec.selector.matchLabels["app.kubernetes.io/component"]])
        .sort();
    const serving = (d: Manifest) => d.spec.template.spec.containers.filter((c: Manifest) => c.name !== "nixl-agent");
    const checkStop = (d: Manifest, grace: number, pause: number | undefined) => {
      expect(d.spec.template.spec.terminationGracePeriodSeconds, d.metadata.name).toBe(grace);
      for (const c of serving(d)) expect(c.lifecycle?.preStop?.sleep?.seconds, `${d.metadata.name}/${c.name}`).toBe(pause);
    };
    const shm = manifests();
    expect(budgets(shm)).toEqual([["rngd-pd-pd", 1, "pd"]]);
    checkStop(deployment(shm, "pd"), 5 + 10 + 10, 5);
    expect(envOf(container(deployment(shm, "pd"), "gateway")).AIRM_DRAIN_S).toBe("10");
    const tcp = manifests([example("tcp")]);
    expect(budgets(tcp)).toEqual([
      ["rngd-pd-decode", 1, "decode"],
      ["rngd-pd-gateway", 1, "gateway"],
      ["rngd-pd-prefill", 1, "prefill"],
    ]);
    const gw = deployment(tcp, "gateway");
    expect(gw.spec.replicas).toBe(2);
    expect(gw.spec.strategy).toEqual({ type: "RollingUpdate", rollingUpdate: { maxSurge: 1, maxUnavailable: 0 } });
    for (const d of ["gateway", "prefill", "decode"]) checkStop(deployment(tcp, d), 25, 5);
    // Knobs: a longer drain lengthens the grace period; no pause, no hook; budgets can be left out.
    const knobs = manifests([example("tcp")], ["airm.drainSeconds=60", "airm.preStopSeconds=0", "podDisruptionBudget.enabled=false"]);
    for (const d of ["gateway", "prefill", "decode"]) checkStop(deployment(knobs, d), 70, undefined);
    expect(envOf(container(deployment(knobs, "gateway"), "gateway")).AIRM_DRAIN_S).toBe("60");
    expect(budgets(knobs)).toEqual([]);
    // The sidecar topology's gateways live in the decode pods: no gateway budget of their own.
    expect(budgets(manifests([example("llm-d-sidecar")])).map((b) => b[0])).toEqual(["rngd-pd-decode", "rngd-pd-prefill"]);
  });

  test("decode on RNGD: the override with `rebellions.ai/ATOM: null` asks for no ATOM; without the nulls the merge keeps it", () => {
    const moved = container(deployment(manifests([example("decode-on-rngd"), example("tcp")]), "decode"), "decode");
    expect(arg(moved, "--backend")).toBe("rngd");
    expect(moved.resources.limits).toEqual({ "furiosa.ai/rngd": 1 });
    // The same override without the nulls, as a first try would write it.
    const naiveFile = join(mkdtempSync(join(tmpdir(), "airm-chart-")), "naive.yaml");
    writeFileSync(
      naiveFile,
      readFileSync(example("decode-on-rngd"), "utf8")
        .split("\n")
        .filter((l) => !l.includes(": null"))
        .join("\n"),
    );
    const naive = deployment(manifests([naiveFile, example("tcp")]), "decode");
    expect(container(naive, "decode").resources.limits).toEqual({ "rebellions.ai/ATOM": 1, "furiosa.ai/rngd": 1 });
    expect(Object.keys(naive.spec.template.spec.nodeSelector).sort()).toEqual(["airm.ai-computing.io/furiosa.RNGD", "airm.ai-computing.io/rebellions.ATOM"]);
  });

  test("every worker finds its card with --chip -1: the checkpoint mounted read-only and POD_UID from the downward API; probes on /health; hardened containers", () => {
    for (const files of Object.values(VALUE_SETS)) {
      const ms = manifests(files);
      for (const d of ms.filter((m) => m.kind === "Deployment")) {
        const pod = d.spec.template.spec;
        for (const c of pod.containers) {
          expect(c.securityContext).toMatchObject({ allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: { drop: ["ALL"] } });
          if (!c.args.includes("--role")) continue;
          expect(arg(c, "--chip")).toBe("-1");
          expect(envOf(c).POD_UID).toEqual({ fieldRef: { fieldPath: "metadata.uid" } });
          const dir = c.volumeMounts.find((m: Manifest) => m.name === "device-plugins");
          expect(dir).toMatchObject({ mountPath: "/var/lib/kubelet/device-plugins", readOnly: true });
          expect(envOf(c).AIRM_KUBELET_CHECKPOINT).toBe("/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint");
          expect(c.readinessProbe.httpGet.path).toBe("/health");
          expect(c.livenessProbe.httpGet.path).toBe("/health");
          expect(c.args).not.toContain("--max-model-len"); // the model's own context unless maxModelLen is set
          expect(envOf(c)).toMatchObject({ AIRM_BLOCK_SIZE: "16", AIRM_KV_CACHE_MEMORY: "0.25", AIRM_MAX_NUM_BATCHED_TOKENS: "2048", AIRM_MAX_NUM_SEQS: "64" });
        }
        for (const c of pod.containers.filter((x: Manifest) => x.name === "gateway" || x.name === "kv-relay")) {
          expect(c.securityContext.runAsNonRoot ?? pod.securityContext?.runAsNonRoot).toBe(true);
        }
      }
    }
  });

  test("security Secrets: AIRM_INTERNAL_TOKEN in every part (workers, gateways, relay), AIRM_API_KEY in the gateways only; none by default", () => {
    const set = ["security.internalTokenSecret=airm-internal", "security.apiKeySecret=airm-keys"];
    const ref = (name: string, key: string) => ({ secretKeyRef: { name, key } });
    for (const files of [[example("tcp")], [], [example("llm-d-sidecar")]]) {
      const ms = manifests(files, set);
      for (const d of ms.filter((m) => m.kind === "Deployment" && m.metadata.name !== "rngd-pd-epp")) {
        for (const c of d.spec.template.spec.containers) {
          const env = envOf(c);
          expect(env.AIRM_INTERNAL_TOKEN, `${d.metadata.name}/${c.name}`).toEqual(ref("airm-internal", "token"));
          expect(env.AIRM_API_KEY, `${d.metadata.name}/${c.name}`).toEqual(c.name === "gateway" ? ref("airm-keys", "keys") : undefined);
        }
      }
      for (const d of manifests(files).filter((m) => m.kind === "Deployment")) {
        for (const c of d.spec.template.spec.containers) expect(envOf(c).AIRM_INTERNAL_TOKEN).toBeUndefined();
      }
    }
    const bad = render([], ["security.internalTokenSecret=Not_A_Name"]);
    expect(bad.ok).toBe(false);
    expect(bad.err).toContain("security/internalTokenSecret");
  });

  test("every variable the chart sets is one the code declares", () => {
    const declared = declaredVariables();
    const set = new Set<string>();
    for (const files of [...Object.values(VALUE_SETS), [example("site.example")]]) {
      for (const m of manifests(files)) {
        if (m.kind !== "Deployment") continue;
        for (const c of m.spec.template.spec.containers) for (const e of c.env ?? []) set.add(e.name);
      }
    }
    expect([...set].filter((name) => !declared.has(name))).toEqual([]);
    expect(set.size).toBeGreaterThan(6);
  });

  test("nixl: the PD pod holds the two workers, the gateway and the NIXL agent, which all see one memory-backed /dev/shm; the workers drive the agent on localhost", () => {
    const ms = manifests([example("nixl")]);
    expect(ms.filter((m) => m.kind === "Deployment").map((m) => m.metadata.name)).toEqual(["rngd-pd-pd"]);
    const pd = deployment(ms, "pd");
    expect(pd.spec.template.spec.containers.map((c: Manifest) => c.name)).toEqual(["prefill", "decode", "gateway", "nixl-agent"]);
    const shm = pd.spec.template.spec.volumes.find((v: Manifest) => v.name === "kv-shm");
    expect(shm.emptyDir).toEqual({ medium: "Memory", sizeLimit: "2Gi" });
    const agent = container(pd, "nixl-agent");
    expect(agent.args).toEqual(["--listen", "127.0.0.1:7500"]);
    expect(envOf(agent).AIRM_NIXL_PYTHON).toBe("/opt/airm/.cache/airm/nixl-1.5.1/venv/bin/python");
    for (const name of ["prefill", "decode", "nixl-agent"]) {
      const c = container(pd, name);
      expect(c.volumeMounts.find((m: Manifest) => m.name === "kv-shm").mountPath, name).toBe("/dev/shm");
    }
    for (const role of ["prefill", "decode"]) {
      const env = envOf(container(pd, role));
      expect(env).toMatchObject({ AIRM_KV_TRANSPORT: "nixl", AIRM_KV_NIXL_ADDR: "127.0.0.1:7500", AIRM_KV_NIXL_POOL_MB: "768" });
      expect(env.PD_SHM_ROOT).toBeUndefined();
    }
    // the internal token reaches the agent too
    const withToken = deployment(manifests([example("nixl")], ["security.internalTokenSecret=airm-internal"]), "pd");
    expect(envOf(container(withToken, "nixl-agent")).AIRM_INTERNAL_TOKEN).toEqual({ secretKeyRef: { name: "airm-internal", key: "token" } });
  });

  test("with inferencePool.create it renders a v1 InferencePool over the serving pods' labels", () => {
    const ms = manifests([example("site.example")]);
    const pool = ms.find((m) => m.kind === "InferencePool");
    expect(pool.apiVersion).toBe("inference.networking.k8s.io/v1");
    expect(pool.spec).toEqual({
      selector: { matchLabels: { "llm-d.ai/inferenceServing": "true", "app.kubernetes.io/instance": "rngd-pd" } },
      targetPorts: [{ number: 8000 }],
      endpointPickerRef: { name: "rngd-pd-epp", port: { number: 9002 }, failureMode: "FailClose" },
    });
    const serving = deployment(ms, "pd").spec.template.metadata.labels;
    for (const [k, v] of Object.entries(pool.spec.selector.matchLabels)) expect(serving[k]).toBe(v);
    expect(manifests().some((m) => m.kind === "InferencePool")).toBe(false);
  });
  test("tls: every part mounts the Secret as AIRM_TLS_DIR (read again every tls.reloadSeconds); gateways call workers over https; probes and scrapes use plain ports; cert-manager's Certificate or an existing Secret", () => {
    const topologies: string[][] = [["airm.kvTransport=tcp", "epp.enabled=true"], ["airm.kvTransport=shm"], ["airm.kvTransport=tcp", "topology=sidecar"]];
    for (const set of topologies) {
      const ms = manifests([], [...set, "tls.enabled=true", "tls.existingSecret=airm-tls"]);
      for (const d of ms.filter((m) => m.kind === "Deployment")) {
        const pod = d.spec.template.spec;
        expect(
          pod.volumes.find((v: Manifest) => v.name === "airm-tls"),
          d.metadata.name,
        ).toEqual({ name: "airm-tls", secret: { secretName: "airm-tls" } });
        for (const c of pod.containers) {
          expect(envOf(c).AIRM_TLS_DIR, `${d.metadata.name}/${c.name}`).toBe("/etc/airm/tls");
          expect(envOf(c).AIRM_TLS_RELOAD_S, `${d.metadata.name}/${c.name}`).toBe("60");
          expect(c.volumeMounts).toContainEqual({ name: "airm-tls", mountPath: "/etc/airm/tls", readOnly: true });
        }
        for (const c of pod.containers.filter((x: Manifest) => x.name === "prefill" || x.name === "decode")) {
          const metricsPort = Number(arg(c, "--metrics-port"));
          expect(metricsPort, `${d.metadata.name}/${c.name}`).toBe(c.name === "prefill" ? 9411 : 9412);
          expect(c.ports).toContainEqual({ name: `${c.name}-metrics`, containerPort: metricsPort });
          expect(c.readinessProbe.httpGet.port).toBe(metricsPort);
          expect(c.livenessProbe.httpGet.port).toBe(metricsPort);
        }
        const gw = pod.containers.find((c: Manifest) => c.name === "gateway");
        if (gw) expect(arg(gw, "--decode"), set.join(" ")).toMatch(/^https:\/\//);
        if (gw?.args.includes("--prefill")) expect(arg(gw, "--prefill")).toMatch(/^https:\/\//);
        if (d.metadata.name === "rngd-pd-epp") expect(container(d, "epp").readinessProbe.grpc.port).toBe(9003);
      }
      expect(ms.some((m) => m.kind === "Certificate")).toBe(false);
    }
    const plain = manifests([], ["airm.kvTransport=tcp"]);
    expect(JSON.stringify(plain)).not.toContain("AIRM_TLS_DIR");
    expect(container(deployment(plain, "prefill"), "prefill").args).not.toContain("--metrics-port");

    const once = manifests([], ["tls.enabled=true", "tls.existingSecret=airm-tls", "tls.reloadSeconds=0"]);
    expect(envOf(container(deployment(once, "pd"), "gateway")).AIRM_TLS_RELOAD_S).toBe("0");

    const cm = manifests([], ["tls.enabled=true", "tls.certManager.enabled=true", "tls.certManager.issuerRef.name=airm-ca"]);
    const cert = cm.find((m) => m.kind === "Certificate");
    expect(cert.apiVersion).toBe("cert-manager.io/v1");
    expect(cert.spec).toMatchObject({
      secretName: "rngd-pd-tls",
      usages: expect.arrayContaining(["server auth", "client auth"]),
      issuerRef: { name: "airm-ca", kind: "Issuer", group: "cert-manager.io" },
    });
    expect(deployment(cm, "pd").spec.template.spec.volumes).toContainEqual({ name: "airm-tls", secret: { secretName: "rngd-pd-tls" } });

    for (const [set, message] of [
      [["tls.enabled=true"], /tls.enabled needs tls.existingSecret .* or tls.certManager.enabled/],
      [["tls.enabled=true", "tls.existingSecret=s", "tls.certManager.enabled=true"], /not both/],
      [["tls.enabled=true", "tls.certManager.enabled=true"], /tls.certManager.issuerRef.name is required/],
      [["tls.certManager.issuerRef.kind=Cluster"], /\/tls\/certManager\/issuerRef\/kind/],
      [["tls.reloadSeconds=-1"], /\/tls\/reloadSeconds/],
    ] as [string[], RegExp][]) {
      const r = render([], set);
      expect(r.ok, set.join(" ")).toBe(false);
      expect(r.err).toMatch(message);
    }
  });
  test("lora: every worker gets AIRM_ENABLE_LORA, the modules as name=path pairs and the limits; nothing by default", () => {
    const ms = manifests(
      [],
      [
        "airm.kvTransport=tcp",
        "lora.enabled=true",
        "lora.modules[0].name=sql",
        "lora.modules[0].path=/models/adapters/sql",
        "lora.modules[1].name=chat",
        "lora.modules[1].path=/models/adapters/chat",
        "lora.maxLoras=2",
      ],
    );
    for (const role of ["prefill", "decode"]) {
      const env = envOf(container(deployment(ms, role), role));
      expect(env, role).toMatchObject({
        AIRM_ENABLE_LORA: "1",
        AIRM_LORA_MODULES: "sql=/models/adapters/sql,chat=/models/adapters/chat",
        AIRM_MAX_LORAS: "2",
        AIRM_MAX_LORA_RANK: "64",
      });
    }
    expect(envOf(container(deployment(ms, "gateway"), "gateway")).AIRM_ENABLE_LORA).toBeUndefined();
    expect(JSON.stringify(manifests())).not.toContain("AIRM_ENABLE_LORA");
    const bad = render([], ["lora.modules[0].name=a=b", "lora.modules[0].path=/x"]);
    expect(bad.ok).toBe(false);
    expect(bad.err).toMatch(/\/lora\/modules\/0\/name/);
  });
});
