// `airm top --k8s`: the pods the chart renders (helm template of charts/rngd-pd, as installed)
// become parts at their pod IPs, by the containers and ports the chart gives them: the PD pod of
// shm (prefill, decode and gateway containers), the role pods and the relay of tcp, and the
// plain metrics ports of TLS. The API server is a stand-in here; test/k8s installs the chart in
// a real one.
import { beforeAll, describe, expect, test } from "vitest";
import { helmBinary, type Manifest, manifests } from "../../../test/chart-render.ts";
import { type K8sApi, k8sSource, type PodView, podTargets, tokenSecretOf } from "../src/top/k8s-source.ts";

let helm: string;
beforeAll(() => {
  helm = helmBinary();
}, 300_000);

/** The pods the Deployments of a render would make, one each, with an IP and restart counts. */
function podsOf(set: string[]): PodView[] {
  const deployments = manifests(helm, [], ["model.path=/models/m", ...set]).filter((m: Manifest) => m.kind === "Deployment");
  return deployments.map((d: Manifest, i: number) => ({
    metadata: { name: `${d.metadata.name}-7d9f8c-x${i}k2p`, labels: d.spec.template.metadata.labels },
    spec: d.spec.template.spec,
    status: {
      phase: "Running",
      podIP: `10.1.0.${i + 10}`,
      containerStatuses: d.spec.template.spec.containers.map((c: { name: string }, k: number) => ({ name: c.name, restartCount: k })),
    },
  }));
}

/** An API server that lists `pods` for the chart's selector and holds one Secret. */
function fakeApi(pods: PodView[], secrets: Record<string, Record<string, string>> = {}): K8sApi & { selectors: string[] } {
  const selectors: string[] = [];
  return {
    selectors,
    async listPods(_ns, selector) {
      selectors.push(selector);
      const [k, v] = selector.split("=");
      return pods.filter((p) => p.metadata?.labels?.[k] === v);
    },
    async podLog(_ns, pod, container, lines) {
      return Array.from({ length: lines }, (_, i) => `${pod}/${container} line ${i}`).join("\n");
    },
    async secret(_ns, name, key) {
      return secrets[name]?.[key] ?? null;
    },
  };
}

const view = (pods: PodView[]) => pods.flatMap((p) => podTargets(p, fakeApi(pods), "serving")).map((t) => [t.name, t.kind, t.role, t.url, t.drainUrl]);

describe("airm top --k8s reads the chart's pods", () => {
  test("shm: each PD pod holds a prefill and a decode worker and a gateway, at its IP on the chart's ports", () => {
    const pods = podsOf(["airm.kvTransport=shm"]);
    expect(pods.map((p) => p.metadata?.labels?.["app.kubernetes.io/component"])).toContain("pd");
    const pd = pods.find((p) => p.metadata?.labels?.["app.kubernetes.io/component"] === "pd")!;
    const ip = pd.status!.podIP;
    expect(view([pd])).toEqual([
      [expect.stringMatching(/^pd-x\dk2p\/prefill$/), "worker", "prefill", `http://${ip}:8101`, `http://${ip}:8101`],
      [expect.stringMatching(/^pd-x\dk2p\/decode$/), "worker", "decode", `http://${ip}:8102`, `http://${ip}:8102`],
      [expect.stringMatching(/^pd-x\dk2p\/gateway$/), "gateway", "gateway", `http://${ip}:8000`, null],
    ]);
  });

  test("tcp: role pods of their own, and the relay read on its metrics port", () => {
    const targets = view(podsOf(["airm.kvTransport=tcp"]));
    expect(targets.map(([, kind, role]) => `${kind}/${role}`).sort()).toEqual(["gateway/gateway", "relay/relay", "worker/decode", "worker/prefill"]);
    expect(targets.find(([, kind]) => kind === "relay")![3]).toMatch(/^http:\/\/10\.1\.0\.\d+:9401$/);
  });

  test("TLS: a worker is read on its plain metrics port and drained on its TLS port", () => {
    const targets = view(podsOf(["airm.kvTransport=tcp", "tls.enabled=true", "tls.existingSecret=airm-tls"]));
    const prefill = targets.find(([, , role]) => role === "prefill")!;
    expect(prefill[3]).toMatch(/^http:\/\/10\.1\.0\.\d+:9411$/);
    expect(prefill[4]).toMatch(/^https:\/\/10\.1\.0\.\d+:8101$/);
  });

  test("restarts are the containers' restart counts, and the log view reads the API server", async () => {
    const pods = podsOf(["airm.kvTransport=shm"]);
    const pd = pods.find((p) => p.metadata?.labels?.["app.kubernetes.io/component"] === "pd")!;
    const targets = podTargets(pd, fakeApi(pods), "serving");
    expect(targets.map((t) => t.restarts)).toEqual([0, 1, 2]);
    expect(await targets[1].logs!.read(2)).toEqual([`${pd.metadata!.name}/decode line 0`, `${pd.metadata!.name}/decode line 1`]);
    expect(targets[1].logs!.where).toBe(`kubectl logs -n serving ${pd.metadata!.name} -c decode`);
  });

  test("the drain token is the one the pods read from their Secret, when airm top may read it", async () => {
    const pods = podsOf(["airm.kvTransport=tcp", "security.internalTokenSecret=airm-internal"]);
    expect(tokenSecretOf(pods)).toEqual({ name: "airm-internal", key: "token" });
    const allowed = k8sSource("serving", fakeApi(pods, { "airm-internal": { token: "s3cret-token-of-the-pods" } }), {});
    await allowed.discover();
    expect(allowed.internalToken).toBe("s3cret-token-of-the-pods");
    const refused = k8sSource("serving", fakeApi(pods), {});
    const d = await refused.discover();
    expect(refused.internalToken).toBeUndefined();
    expect(d.notes.join()).toContain("cannot read secret airm-internal");
  });

  test("it says plainly when no pod matches, and lists with the chart's selector", async () => {
    const api = fakeApi(podsOf(["airm.kvTransport=shm"]));
    const d = await k8sSource("serving", api, { selector: "app.kubernetes.io/name=other" }).discover();
    expect(d.targets).toEqual([]);
    expect(d.notes).toEqual(["no pod in serving matches app.kubernetes.io/name=other"]);
    expect((await k8sSource("serving", api, {}).discover()).targets.length).toBeGreaterThan(0);
    expect(api.selectors.at(-1)).toBe("app.kubernetes.io/name=rngd-pd");
  });
});
