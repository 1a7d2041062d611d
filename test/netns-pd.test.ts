// PD across hosts for real: the gateway, the prefill worker, the decode worker and the KV relay
// each on a host of its own (scripts/netns-rig: network namespaces joined by a switch, links
// shaped to 1 Gbit/s), KV over `tcp` through the relay; the answers equal a solo worker's on this
// host's loopback, greedy and seeded. Needs root (CI runs as root); skipped with the reason otherwise.
import { type ChildProcess, spawn } from "node:child_process";
import { existsSync, mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { makeTinyModel } from "../packages/llama/src/index.ts";
import { freePort } from "../packages/workload-runner/src/cluster-plan.ts";
import { NetnsRig } from "../scripts/netns-rig/rig.ts";

const why = process.getuid?.() !== 0 ? "needs root (CAP_NET_ADMIN)" : ["/usr/sbin/ip", "/usr/sbin/tc"].some((p) => !existsSync(p)) ? "needs iproute2 (ip, tc)" : null;
const bin = (pkg: string, name: string) => fileURLToPath(new URL(`../packages/${pkg}/bin/${name}.mjs`, import.meta.url));
const QUIET = { AIRM_LOG_LEVEL: "warn", AIRM_ENGINE_LOG: "0" };

/** Runs a fetch from inside `host` (this process cannot reach the rig's addresses) and returns the body. */
function fetchIn(rig: NetnsRig, host: string, url: string, body?: unknown): string {
  const script = `fetch(${JSON.stringify(url)}, ${body === undefined ? "{}" : JSON.stringify({ method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) })})
    .then(async (r) => { process.stdout.write(await r.text()); process.exit(r.ok ? 0 : 4); }, (e) => { console.error(String(e.cause ?? e)); process.exit(3); });`;
  return rig.sh(host, process.execPath, ["-e", script]);
}

async function until(what: string, ok: () => boolean, seconds: number): Promise<void> {
  const t0 = Date.now();
  while (!ok()) {
    if (Date.now() - t0 > seconds * 1000) throw new Error(`${what}: not within ${seconds} s`);
    await new Promise((r) => setTimeout(r, 300));
  }
}

describe.skipIf(why !== null)(`PD across network namespaces${why ? ` (skipped: ${why})` : ""}`, () => {
  let rig: NetnsRig;
  let solo: ChildProcess;
  let soloGateway: ChildProcess;
  let soloPort = 0;
  let soloGatewayPort = 0;
  const model = mkdtempSync(join(tmpdir(), "airm-netns-model-"));

  beforeAll(async () => {
    makeTinyModel({ arch: "llama", out: model });
    [soloPort, soloGatewayPort] = [await freePort(), await freePort()];
    rig = await NetnsRig.up({ hosts: ["gateway-node", "prefill-node", "decode-node", "relay-node"], link: { rate: "1gbit", burst: "256kb", mtu: 1500 } });
    const ip = (h: string) => rig.host(h).address;
    const env = { ...process.env, ...QUIET, AIRM_KV_TRANSPORT: "tcp", AIRM_KV_TCP_ADDR: `${ip("relay-node")}:7400` };
    rig.spawn("relay-node", process.execPath, [bin("kv-relay", "airm-kv-relay"), "--listen", `${ip("relay-node")}:7400`], { stdio: "ignore", env });
    rig.spawn(
      "prefill-node",
      process.execPath,
      [bin("worker", "airm-worker"), "--role", "prefill", "--backend", "rngd-full", "--host", ip("prefill-node"), "--port", "8101", "--model", model],
      { stdio: "ignore", env },
    );
    rig.spawn(
      "decode-node",
      process.execPath,
      [bin("worker", "airm-worker"), "--role", "decode", "--backend", "atom", "--host", ip("decode-node"), "--port", "8102", "--model", model],
      { stdio: "ignore", env },
    );
    rig.spawn(
      "gateway-node",
      process.execPath,
      [
        bin("gateway", "airm-gateway"),
        "--host",
        ip("gateway-node"),
        "--port",
        "8000",
        "--prefill",
        `http://${ip("prefill-node")}:8101`,
        "--decode",
        `http://${ip("decode-node")}:8102`,
      ],
      { stdio: "ignore", env: { ...process.env, ...QUIET, AIRM_HEALTH_INTERVAL_MS: "500" } },
    );
    // the reference: one solo worker and its gateway on this host's loopback, outside the rig
    solo = spawn(process.execPath, [bin("worker", "airm-worker"), "--role", "solo", "--backend", "rngd-full", "--port", String(soloPort), "--model", model], {
      stdio: "ignore",
      env: { ...process.env, ...QUIET },
    });
    soloGateway = spawn(process.execPath, [bin("gateway", "airm-gateway"), "--port", String(soloGatewayPort), "--solo", `http://127.0.0.1:${soloPort}`], {
      stdio: "ignore",
      env: { ...process.env, ...QUIET, AIRM_HEALTH_INTERVAL_MS: "500" },
    });
    const healthy = (host: string, url: string) => () => {
      try {
        return JSON.parse(fetchIn(rig, host, url)).status === "ok";
      } catch {
        return false;
      }
    };
    await until("the gateway in the rig is healthy", healthy("gateway-node", `http://${ip("gateway-node")}:8000/health`), 120);
    let soloUp = false;
    await until(
      "the solo gateway is healthy",
      () => {
        void fetch(`http://127.0.0.1:${soloGatewayPort}/health`).then(
          async (r) => {
            soloUp = r.ok && ((await r.json()) as { status?: string }).status === "ok";
          },
          () => {},
        );
        return soloUp;
      },
      120,
    );
  }, 240_000);

  afterAll(async () => {
    solo?.kill("SIGTERM");
    soloGateway?.kill("SIGTERM");
    await rig?.down();
  });

  it("prefill, decode, relay and gateway on four hosts give the solo worker's tokens, greedy and seeded", async () => {
    const gw = `http://${rig.host("gateway-node").address}:8000`;
    for (const extra of [{ temperature: 0 }, { temperature: 0.9, top_p: 0.95, seed: 4242 }]) {
      const req = { model: "m", prompt: "The quick brown fox jumps over the lazy dog and", max_tokens: 24, ...extra };
      const pd = JSON.parse(fetchIn(rig, "gateway-node", `${gw}/v1/completions`, { ...req, model: JSON.parse(fetchIn(rig, "gateway-node", `${gw}/v1/models`)).data[0].id }));
      const soloModel = ((await (await fetch(`http://127.0.0.1:${soloGatewayPort}/v1/models`)).json()) as { data: { id: string }[] }).data[0]!.id;
      const ref = (await (
        await fetch(`http://127.0.0.1:${soloGatewayPort}/v1/completions`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify({ ...req, model: soloModel }),
        })
      ).json()) as { choices: { text: string }[]; usage: { completion_tokens: number } };
      expect(pd.usage.completion_tokens).toBe(24);
      expect(pd.choices[0].text).toBe(ref.choices[0]!.text);
    }
    // the KV crossed the rig: the relay's host saw the decode and prefill hosts' connections
    const conns = rig.sh("relay-node", "ss", ["-tn", "state", "established"]);
    expect(conns).toContain(rig.host("prefill-node").address);
    expect(conns).toContain(rig.host("decode-node").address);
  });
});
