// What tests and benches do with a chart release on the rig: run helm against it, find the pods of
// a component with the IPs the pod runner gave them once they serve, and hold load on a gateway.
import { execFile } from "node:child_process";
import { connect } from "node:net";
import type { PodRunner } from "./pod-runner.ts";
import type { Rig } from "./rig.ts";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * Runs helm without blocking this process: the pod runner lives here too and must keep starting
 * pods and answering for their readiness while `helm --wait` waits for them. Throws with helm's
 * stderr.
 */
export function helm(bin: string, args: string[]): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile(bin, args, { encoding: "utf8", maxBuffer: 64 << 20 }, (err, stdout, stderr) => {
      if (err) reject(new Error(`helm ${args.join(" ")}: ${stderr || err.message}`));
      else resolve(stdout);
    });
  });
}

/** A pod of the release with the address its processes listen on. */
export interface PodAt {
  name: string;
  ip: string;
}

export class Release {
  constructor(
    readonly rig: Rig,
    readonly runner: PodRunner,
    readonly helm: string,
    readonly namespace: string,
  ) {}

  /** Runs helm against the rig in the release's namespace; throws with helm's stderr. */
  helmRun(args: string[]): Promise<string> {
    return helm(this.helm, [...args, "--kubeconfig", this.rig.kubeconfig, "--namespace", this.namespace]);
  }

  /**
   * Installs the chart at `chart` as release rngd-pd: two PD pods (shm) on `model` serving up to
   * `maxModelLen` (null: the model's context), and an InferencePool `pool` over them; `set`: more
   * values (key=value).
   */
  async installPdPool(chart: string, o: { model: string; maxModelLen: number | null; pool: string; set?: string[] }): Promise<void> {
    const values = [`model.path=${o.model}`, "prefill.replicas=2", "inferencePool.create=true", `inferencePool.name=${o.pool}`];
    if (o.maxModelLen !== null) values.push(`maxModelLen=${o.maxModelLen}`);
    await this.helmRun(["install", "rngd-pd", chart, ...[...values, ...(o.set ?? [])].flatMap((v) => ["--set", v]), "--wait", "--timeout", "180s"]);
  }

  /** The last output lines of every pod's processes (for failure messages). */
  podLogs(): string {
    return this.runner.podLogs();
  }

  /** Polls `f` every 250 ms until it gives a truthy value; throws naming `what` (and the pods' logs) after `ms`. */
  async until<T>(what: string, f: () => T | null | undefined | false | Promise<T | null | undefined | false>, ms = 120_000): Promise<T> {
    const end = Date.now() + ms;
    for (;;) {
      const v = await f();
      if (v) return v;
      if (Date.now() > end) throw new Error(`not within ${ms} ms: ${what}\n${this.podLogs()}`);
      await sleep(250);
    }
  }

  /** The `component` pods (app.kubernetes.io/component) not being deleted, with their IPs once the runner started them. */
  pods(component: string): { name: string; ip: string | undefined }[] {
    const items = JSON.parse(this.rig.kubectl(["get", "pods", "-n", this.namespace, "-l", `app.kubernetes.io/component=${component}`, "-o", "json"])).items as {
      metadata: { name: string; deletionTimestamp?: string };
    }[];
    return items
      .filter((p) => !p.metadata.deletionTimestamp)
      .map((p) => ({ name: p.metadata.name, ip: [...this.runner.pods.values()].find((r) => r.name === p.metadata.name)?.ip }));
  }

  /** `n` pods of `component`, once each answers GET /health with 200 on `port`. */
  serving(component: string, n: number, port: number): Promise<PodAt[]> {
    return this.until(`${n} ${component} pods serving on :${port}`, async () => {
      const ps = this.pods(component);
      if (ps.length !== n || ps.some((p) => !p.ip)) return null;
      const ok = await Promise.all(
        ps.map((p) =>
          fetch(`http://${p.ip}:${port}/health`).then(
            (r) => r.status === 200,
            () => false,
          ),
        ),
      );
      return ok.every(Boolean) ? (ps as PodAt[]) : null;
    });
  }

  /** `n` pods of `component`, once each accepts TCP connections on `port` (a gRPC server). */
  listening(component: string, n: number, port: number): Promise<PodAt[]> {
    return this.until(`${n} ${component} pods listening on :${port}`, async () => {
      const ps = this.pods(component);
      if (ps.length !== n || ps.some((p) => !p.ip)) return null;
      return (await Promise.all(ps.map((p) => tcpOpen(p.ip!, port)))).every(Boolean) ? (ps as PodAt[]) : null;
    });
  }
}

/** True when something accepts a TCP connection at host:port. */
export function tcpOpen(host: string, port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = connect(port, host);
    s.once("connect", () => {
      s.destroy();
      resolve(true);
    });
    s.once("error", () => resolve(false));
  });
}

/** Completions the gateway at `ip`:8000 has answered (its airm_gateway_requests_total on /v1/ routes, status 200). */
export async function gatewayServed(ip: string): Promise<number> {
  const text = await (await fetch(`http://${ip}:8000/metrics`)).text();
  let n = 0;
  for (const m of text.matchAll(/^airm_gateway_requests_total\{([^}]*)\} (\d+)/gm)) if (m[1]!.includes('status="200"') && m[1]!.includes("/v1/")) n += Number(m[2]);
  return n;
}

/** A metric's value in Prometheus text summed over its series (labelled or not), 0 when absent. */
export function metricSum(text: string, name: string): number {
  let n = 0;
  for (const m of text.matchAll(new RegExp(`^${name}(?:\\{[^}]*\\})? (\\S+)$`, "gm"))) n += Number(m[1]);
  return n;
}

/** A gauge's value in Prometheus text (the unlabelled series), 0 when absent. */
export function gauge(text: string, name: string): number {
  return Number(new RegExp(`^${name} (\\S+)$`, "m").exec(text)?.[1] ?? 0);
}

/**
 * Keeps `n` long streamed completions (max_tokens 400) in flight on the gateway at `url` until
 * the returned function is called: each holder sends its next request as soon as one ends, so the
 * load lasts however long the caller measures. Resolves once the gateway reports all `n` past
 * their first token (vllm:num_requests_running).
 */
export async function holdOpen(release: Release, url: string, model: string, n = 4): Promise<() => Promise<void>> {
  const hold = new AbortController();
  const holder = async (i: number) => {
    while (!hold.signal.aborted) {
      await fetch(`${url}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ model, prompt: `held open number ${i}`, max_tokens: 400, temperature: 0, stream: true }),
        signal: hold.signal,
      })
        .then((r) => r.text())
        .catch(() => "");
    }
  };
  const held = Array.from({ length: n }, (_, i) => holder(i));
  await release.until(`the gateway at ${url} reporting its ${n} held requests`, async () => gauge(await (await fetch(`${url}/metrics`)).text(), "vllm:num_requests_running") >= n);
  return async () => {
    hold.abort();
    await Promise.all(held);
  };
}

/**
 * The chart tests' completion (greedy, 12 tokens, one fixed prompt) through a gateway at `url`:
 * its text and token count, or an error with the answer when it is not a 200.
 */
export async function chartCompletion(url: string): Promise<{ text: string; tokens: number }> {
  const models = (await (await fetch(`${url}/v1/models`)).json()) as { data: { id: string }[] };
  const r = await fetch(`${url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: models.data[0]!.id, prompt: "The chart puts prefill on RNGD and", max_tokens: 12, temperature: 0 }),
  });
  const body = (await r.json()) as { choices: { text: string }[]; usage: { completion_tokens: number } };
  if (r.status !== 200) throw new Error(`completion through ${url}: ${r.status} ${JSON.stringify(body)}`);
  return { text: body.choices[0]!.text, tokens: body.usage.completion_tokens };
}
