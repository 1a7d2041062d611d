// `airm top --k8s NAMESPACE`: the chart's pods found through the API server (KUBECONFIG,
// ~/.kube/config or in-cluster), each serving container a part read at the pod's IP: the
// workers (containers prefill, decode, solo; on their plain metrics port when the chart serves
// TLS), the gateways (port http) and the KV relay (port metrics). Restarts are the containers'
// restart counts, log lines come from the API server, and the drain token is the one the pods
// get: AIRM_INTERNAL_TOKEN if set here, else read from the Secret their spec names (which needs
// get on it). Pod IPs must be reachable from where airm top runs (inside the cluster, or a
// network that routes to pods).

import type { TlsMaterial } from "@airm/rm-core";
import type { Discovery, LogSource, Source, Target } from "./targets.ts";

/** The parts of a v1 Pod read here (structurally @kubernetes/client-node's V1Pod). */
export interface PodView {
  metadata?: { name?: string; labels?: Record<string, string> };
  spec?: {
    containers?: {
      name: string;
      ports?: { name?: string; containerPort: number }[];
      env?: { name: string; valueFrom?: { secretKeyRef?: { name?: string; key: string } } }[];
    }[];
  };
  status?: { phase?: string; podIP?: string; containerStatuses?: { name: string; restartCount: number }[] };
}

/** What the source asks the API server (the real one is kubeClient(); tests pass their own). */
export interface K8sApi {
  listPods(namespace: string, labelSelector: string): Promise<PodView[]>;
  podLog(namespace: string, pod: string, container: string, lines: number): Promise<string>;
  /** A Secret's value under `key`, decoded; null when absent. */
  secret(namespace: string, name: string, key: string): Promise<string | null>;
}

/** The chart's label every pod carries (its Chart.Name). */
export const CHART_SELECTOR = "app.kubernetes.io/name=rngd-pd";

const WORKER_CONTAINERS = new Set(["prefill", "decode", "solo"]);

const portOf = (c: NonNullable<NonNullable<PodView["spec"]>["containers"]>[number], name: string) => c.ports?.find((p) => p.name === name)?.containerPort;

/** A pod's short name: its component and the generated suffix (pd-x7k2p), else its name. */
function shortName(pod: PodView): string {
  const name = pod.metadata?.name ?? "pod";
  const component = pod.metadata?.labels?.["app.kubernetes.io/component"];
  const suffix = name.split("-").at(-1);
  return component && suffix ? `${component}-${suffix}` : name;
}

/** The log lines of one container through the API server. */
function podLogs(api: K8sApi, namespace: string, pod: string, container: string): LogSource {
  return { where: `kubectl logs -n ${namespace} ${pod} -c ${container}`, read: async (n) => (await api.podLog(namespace, pod, container, n)).split("\n").filter(Boolean) };
}

/** The targets of one pod: its serving containers. */
export function podTargets(pod: PodView, api: K8sApi, namespace: string): Target[] {
  const ip = pod.status?.podIP;
  const podName = pod.metadata?.name ?? "";
  const containers = pod.spec?.containers ?? [];
  const restarts = (c: string) => pod.status?.containerStatuses?.find((s) => s.name === c)?.restartCount ?? 0;
  const nameOf = (c: string) => (containers.length > 1 ? `${shortName(pod)}/${c}` : shortName(pod));
  const at = (port: number | undefined, scheme = "http") => (ip && port ? `${scheme}://${ip}:${port}` : null);
  const out: Target[] = [];
  for (const c of containers) {
    const base = { name: nameOf(c.name), logs: podLogs(api, namespace, podName, c.name), restarts: restarts(c.name) };
    if (WORKER_CONTAINERS.has(c.name)) {
      // with TLS the chart adds a plain metrics port (ROLE-metrics) and the serving port asks a client certificate
      const plain = portOf(c, `${c.name}-metrics`);
      const serving = at(portOf(c, c.name), plain ? "https" : "http");
      out.push({ ...base, kind: "worker", role: c.name, url: plain ? at(plain) : serving, drainUrl: serving });
    } else if (c.name === "gateway") out.push({ ...base, kind: "gateway", role: "gateway", url: at(portOf(c, "http")), drainUrl: null });
    else if (c.name === "kv-relay") out.push({ ...base, kind: "relay", role: "relay", url: at(portOf(c, "metrics")), drainUrl: null });
  }
  return out;
}

/** The Secret and key the pods take AIRM_INTERNAL_TOKEN from, if their spec names one. */
export function tokenSecretOf(pods: PodView[]): { name: string; key: string } | null {
  for (const p of pods)
    for (const c of p.spec?.containers ?? [])
      for (const e of c.env ?? []) {
        const ref = e.valueFrom?.secretKeyRef;
        if (e.name === "AIRM_INTERNAL_TOKEN" && ref?.name) return { name: ref.name, key: ref.key };
      }
  return null;
}

/** The real API server, from the default KubeConfig; @kubernetes/client-node is loaded on the first call. */
export function kubeClient(): K8sApi {
  let core: Promise<import("@kubernetes/client-node").CoreV1Api> | undefined;
  const load = () =>
    (core ??= import("@kubernetes/client-node").then((k) => {
      const kc = new k.KubeConfig();
      kc.loadFromDefault();
      return kc.makeApiClient(k.CoreV1Api);
    }));
  return {
    async listPods(namespace, labelSelector) {
      return (await (await load()).listNamespacedPod({ namespace, labelSelector })).items as PodView[];
    },
    async podLog(namespace, name, container, lines) {
      return (await load()).readNamespacedPodLog({ namespace, name, container, tailLines: lines });
    },
    async secret(namespace, name, key) {
      const s = await (await load()).readNamespacedSecret({ namespace, name });
      const v = s.data?.[key];
      return v === undefined ? null : Buffer.from(v, "base64").toString("utf8");
    },
  };
}

/** The source of a namespace: the chart's pods, listed at every reading. */
export function k8sSource(namespace: string, api: K8sApi, o: { selector?: string; internalToken?: string; apiKey?: string; tls?: TlsMaterial }): Source {
  const selector = o.selector ?? CHART_SELECTOR;
  const src: Source = {
    kind: "k8s",
    label: `k8s ${namespace} (${selector})`,
    internalToken: o.internalToken,
    apiKey: o.apiKey,
    tls: o.tls,
    async discover(): Promise<Discovery> {
      let pods: PodView[];
      try {
        pods = await api.listPods(namespace, selector);
      } catch (e) {
        return { targets: [], notes: [`cannot list the pods of ${namespace} (${selector}): ${(e as Error).message}`] };
      }
      const notes = pods.length ? [] : [`no pod in ${namespace} matches ${selector}`];
      if (!src.internalToken) notes.push(...(await findToken(pods)));
      const running = pods.filter((p) => p.status?.podIP);
      if (running.length < pods.length) notes.push(`${pods.length - running.length} pod(s) without an IP yet`);
      return { targets: running.flatMap((p) => podTargets(p, api, namespace)), notes };
    },
  };
  /** Reads the token from the pods' Secret once; a note says why a drain cannot be sent otherwise. */
  let tokenTried = false;
  const findToken = async (pods: PodView[]): Promise<string[]> => {
    const ref = tokenSecretOf(pods);
    if (!ref) return [];
    if (tokenTried) return [`no internal token: d cannot drain (set AIRM_INTERNAL_TOKEN, or allow get on secret ${ref.name})`];
    tokenTried = true;
    src.internalToken = (await api.secret(namespace, ref.name, ref.key).catch(() => null)) ?? undefined;
    return src.internalToken ? [] : [`cannot read secret ${ref.name}: d cannot drain (set AIRM_INTERNAL_TOKEN)`];
  };
  return src;
}
