// What the tests across the netns rig share: HTTP from inside a rig host (this process cannot
// reach the rig's addresses), waiting for a condition, and the solo worker on this host's loopback
// whose answers PD across the hosts must equal (killed, like the rig, if a signal stops the test).
import { type ChildProcess, spawn, spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import { freePort } from "../packages/workload-runner/src/cluster-plan.ts";
import { gatewayArgv } from "../packages/workload-runner/src/rngd-pd-workload.ts";
import type { NetnsRig } from "../scripts/netns-rig/rig.ts";
import { killOnInterrupt } from "../scripts/rig-cleanup.ts";

export const QUIET = { AIRM_LOG_LEVEL: "warn", AIRM_ENGINE_LOG: "0" };
export const bin = (pkg: string, name: string) => fileURLToPath(new URL(`../packages/${pkg}/bin/${name}.mjs`, import.meta.url));

/** Runs a fetch from inside `host` and returns the body; throws unless the answer is 2xx. */
export function fetchIn(rig: NetnsRig, host: string, url: string, body?: unknown): string {
  const script = `fetch(${JSON.stringify(url)}, ${body === undefined ? "{}" : JSON.stringify({ method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) })})
    .then(async (r) => { process.stdout.write(await r.text()); process.exit(r.ok ? 0 : 4); }, (e) => { console.error(String(e.cause ?? e)); process.exit(3); });`;
  return rig.sh(host, process.execPath, ["-e", script]);
}

/** A POST from inside `host` that answers whatever came back: the status (0: no answer) and body, and how long it took. */
export function postIn(rig: NetnsRig, host: string, url: string, body: unknown, timeoutS: number): { status: number; body: string; ms: number } {
  const script = `fetch(${JSON.stringify(url)}, ${JSON.stringify({ method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) })})
    .then(async (r) => process.stdout.write(r.status + " " + (await r.text())), (e) => process.stdout.write("0 fetch " + String(e.cause ?? e)));`;
  const t0 = Date.now();
  const out = spawnSync("nsenter", ["-t", String(rig.host(host).pid), "-n", "--", process.execPath, "-e", script], { encoding: "utf8", timeout: timeoutS * 1000 });
  const text = out.stdout ?? "";
  return { status: Number(text.split(" ")[0]) || 0, body: text.slice(text.indexOf(" ") + 1), ms: Date.now() - t0 };
}

export async function until(what: string, ok: () => Promise<boolean> | boolean, seconds: number): Promise<void> {
  const t0 = Date.now();
  while (!(await ok())) {
    if (Date.now() - t0 > seconds * 1000) throw new Error(`${what}: not within ${seconds} s`);
    await new Promise((r) => setTimeout(r, 250));
  }
}

/** A solo worker and its gateway on this host's loopback, outside the rig: the reference. */
export class SoloReference {
  private procs: ChildProcess[] = [];
  private url = "";
  private modelId = "";

  async start(model: string): Promise<void> {
    const [workerPort, gatewayPort] = [await freePort(), await freePort()];
    this.procs.push(
      killOnInterrupt(
        spawn(process.execPath, [bin("worker", "airm-worker"), "--role", "solo", "--backend", "rngd-full", "--port", String(workerPort), "--model", model], {
          stdio: "ignore",
          env: { ...process.env, ...QUIET },
        }),
      ),
    );
    const gw = gatewayArgv({ host: "127.0.0.1", port: gatewayPort, solo: [`http://127.0.0.1:${workerPort}`] });
    this.procs.push(killOnInterrupt(spawn(gw[0]!, gw.slice(1), { stdio: "ignore", env: { ...process.env, ...QUIET, AIRM_HEALTH_INTERVAL_MS: "500" } })));
    this.url = `http://127.0.0.1:${gatewayPort}`;
    await until(
      "the solo gateway is healthy",
      () =>
        fetch(`${this.url}/health`).then(
          async (r) => r.ok && ((await r.json()) as { status?: string }).status === "ok",
          () => false,
        ),
      120,
    );
    this.modelId = ((await (await fetch(`${this.url}/v1/models`)).json()) as { data: { id: string }[] }).data[0]!.id;
  }

  /** The solo answer's text to a completion request (its model replaced by the solo one's). */
  async text(req: Record<string, unknown>): Promise<string> {
    const r = await fetch(`${this.url}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ ...req, model: this.modelId }) });
    return ((await r.json()) as { choices: { text: string }[] }).choices[0]!.text;
  }

  stop(): void {
    for (const p of this.procs) p.kill("SIGTERM");
  }
}
