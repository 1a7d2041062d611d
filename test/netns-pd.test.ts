// PD across hosts for real: the gateway, the prefill worker, the decode worker and the KV relay
// each on a host of its own (scripts/netns-rig: network namespaces joined by a switch, links
// shaped to 1 Gbit/s), KV over `tcp` through the relay; the answers equal a solo worker's on this
// host's loopback, greedy and seeded. Needs root (CI runs as root); skipped with the reason otherwise.
import { existsSync, mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { makeTinyModel } from "../packages/llama/src/index.ts";
import { gatewayArgv } from "../packages/workload-runner/src/rngd-pd-workload.ts";
import { NetnsRig } from "../scripts/netns-rig/rig.ts";
import { bin, fetchIn, postIn, QUIET, SoloReference, until } from "./netns-helpers.ts";

const why = process.getuid?.() !== 0 ? "needs root (CAP_NET_ADMIN)" : ["/usr/sbin/ip", "/usr/sbin/tc"].some((p) => !existsSync(p)) ? "needs iproute2 (ip, tc)" : null;
/** A decode's pull gives up after this long (the cut below lasts longer). */
const KV_TIMEOUT_MS = 3000;
/**
 * The relay drops blobs nobody released after this long: longer than the test, so that what it
 * finds released was released at once. (A push the link cut stalled can complete after its
 * request failed and was released, as TCP resumes when the link comes back; the relay then drops
 * it and counts a late push instead of holding it for the TTL.)
 */
const RELAY_TTL_S = 300;

/**
 * One PD cluster per transport in the same rig: its prefill worker on prefill-node, its decode
 * worker on decode-node, its gateway on gateway-node, sharing the relay on relay-node. nixl-ucx
 * runs with UCX_TLS=tcp: the hosts share this machine's memory, and UCX would otherwise take a
 * shared-memory path between them instead of the link.
 */
const STACKS = [
  { transport: "tcp", prefill: 8101, decode: 8102, gateway: 8000, env: {} },
  { transport: "nixl-ucx", prefill: 8201, decode: 8202, gateway: 8001, env: { UCX_TLS: "tcp", AIRM_KV_UCX_POOL_MB: "256" } },
] as const;

describe.skipIf(why !== null)(`PD across network namespaces${why ? ` (skipped: ${why})` : ""}`, () => {
  let rig: NetnsRig;
  const solo = new SoloReference();
  const model = mkdtempSync(join(tmpdir(), "airm-netns-model-"));
  let kvLowerBound = 0;

  const startStack = (stack: (typeof STACKS)[number]) => {
    const ip = (h: string) => rig.host(h).address;
    const env = {
      ...process.env,
      ...QUIET,
      ...stack.env,
      AIRM_KV_TRANSPORT: stack.transport,
      AIRM_KV_TCP_ADDR: `${ip("relay-node")}:7400`,
      AIRM_KV_TIMEOUT_MS: String(KV_TIMEOUT_MS),
    };
    const worker = (host: string, role: string, backend: string, port: number) =>
      rig.spawn(host, process.execPath, [bin("worker", "airm-worker"), "--role", role, "--backend", backend, "--host", ip(host), "--port", String(port), "--model", model], {
        stdio: "ignore",
        env,
      });
    worker("prefill-node", "prefill", "rngd-full", stack.prefill);
    worker("decode-node", "decode", "atom", stack.decode);
    const gw = gatewayArgv({
      host: ip("gateway-node"),
      port: stack.gateway,
      prefill: [`http://${ip("prefill-node")}:${stack.prefill}`],
      decode: [`http://${ip("decode-node")}:${stack.decode}`],
    });
    rig.spawn("gateway-node", gw[0]!, gw.slice(1), { stdio: "ignore", env: { ...process.env, ...QUIET, AIRM_HEALTH_INTERVAL_MS: "500" } });
  };

  beforeAll(async () => {
    const { config } = makeTinyModel({ arch: "llama", out: model });
    // a lower bound of one request's KV: 2 (k, v) x layers x kv heads x head dim x bf16 x the
    // positions the request needs at least (its 24 new tokens and a prompt of 10 or more); the
    // blobs are S wide, S >= that
    const c = config as { num_hidden_layers: number; num_key_value_heads: number; head_dim: number };
    kvLowerBound = 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * 2 * (24 + 10);
    rig = await NetnsRig.up({ hosts: ["gateway-node", "prefill-node", "decode-node", "relay-node"], link: { rate: "1gbit", burst: "256kb", mtu: 1500 } });
    const ip = (h: string) => rig.host(h).address;
    rig.spawn(
      "relay-node",
      process.execPath,
      [bin("kv-relay", "airm-kv-relay"), "--listen", `${ip("relay-node")}:7400`, "--metrics-port", "9400", "--ttl-s", String(RELAY_TTL_S)],
      { stdio: "ignore", env: { ...process.env, ...QUIET } },
    );
    for (const stack of STACKS) startStack(stack);
    // the reference: one solo worker and its gateway on this host's loopback, outside the rig
    await solo.start(model);
    const healthy = (host: string, url: string) => () => {
      try {
        return JSON.parse(fetchIn(rig, host, url)).status === "ok";
      } catch {
        return false;
      }
    };
    for (const stack of STACKS)
      await until(`the ${stack.transport} gateway in the rig is healthy`, healthy("gateway-node", `http://${ip("gateway-node")}:${stack.gateway}/health`), 120);
  }, 240_000);

  afterAll(async () => {
    solo.stop();
    await rig?.down();
  });

  it.each(STACKS)("prefill, decode, relay and gateway on four hosts give the solo worker's tokens over $transport, greedy and seeded", { timeout: 60_000 }, async (stack) => {
    const gw = `http://${rig.host("gateway-node").address}:${stack.gateway}`;
    const decodeIf = () => Number(/eth0:\s*(\d+)/.exec(rig.sh("decode-node", "cat", ["/proc/net/dev"]))?.[1]);
    const received0 = decodeIf();
    for (const extra of [{ temperature: 0 }, { temperature: 0.9, top_p: 0.95, seed: 4242 }]) {
      const req = { model: "m", prompt: "The quick brown fox jumps over the lazy dog and", max_tokens: 24, ...extra };
      const pd = JSON.parse(fetchIn(rig, "gateway-node", `${gw}/v1/completions`, { ...req, model: JSON.parse(fetchIn(rig, "gateway-node", `${gw}/v1/models`)).data[0].id }));
      expect(pd.usage.completion_tokens).toBe(24);
      expect(pd.choices[0].text).toBe(await solo.text(req));
    }
    // the KV crossed the rig: the decode host's link received at least the two requests' KV
    const received = decodeIf() - received0;
    console.log(`${stack.transport}: the decode host's link received ${received} bytes for 2 requests (their KV: at least ${2 * kvLowerBound})`);
    expect(received).toBeGreaterThan(2 * kvLowerBound);
    if (stack.transport === "tcp") {
      const conns = rig.sh("relay-node", "ss", ["-tn", "state", "established"]);
      expect(conns).toContain(rig.host("prefill-node").address);
      expect(conns).toContain(rig.host("decode-node").address);
    } else {
      // the decode host READ from the prefill host directly (UCX over TCP), not through the relay
      expect(rig.sh("decode-node", "ss", ["-tn", "state", "established"])).toContain(rig.host("prefill-node").address);
    }
  });

  it("a link cut in the middle of a request gives the client a bounded error, leaks nothing on any host, and the next request is whole", async () => {
    const ip = (h: string) => rig.host(h).address;
    const gw = `http://${ip("gateway-node")}:8000`;
    const model = JSON.parse(fetchIn(rig, "gateway-node", `${gw}/v1/models`)).data[0].id;
    // A prompt no earlier test sent: the decode worker holds none of its blocks, so its whole KV
    // crosses the slow link (a prompt it held would push one block, which may beat the cut).
    const req = { model, prompt: "Sphinx of black quartz, judge my vow, then count the waves", max_tokens: 8, temperature: 0 };
    // a slow prefill host (the KV push then takes seconds), cut while it pushes, for twice the KV timeout
    rig.shape("prefill-node", "50kbit", "4kb", "2s");
    const t0 = Date.now();
    const client = rig.spawn("gateway-node", process.execPath, [
      "-e",
      `fetch(${JSON.stringify(`${gw}/v1/completions`)}, ${JSON.stringify({ method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(req) })}).then(async (r) => process.stdout.write(r.status + " " + (await r.text())), (e) => process.stdout.write("fetch " + String(e.cause ?? e)))`,
    ]);
    let out = "";
    client.stdout!.on("data", (d: Buffer) => {
      out += d.toString();
    });
    const done = new Promise<void>((r) => client.once("exit", () => r()));
    const gauge = (host: string, url: string, name: string) => Number(new RegExp(`^${name}(?:\\{[^}]*\\})? (\\S+)$`, "m").exec(fetchIn(rig, host, url))?.[1]);
    // cut once the prefill worker holds the request (its KV push is then under way on the slow link)
    await until("the prefill worker takes the request", () => gauge("prefill-node", `http://${ip("prefill-node")}:8101/metrics`, "airm_kv_leases_outstanding") >= 1, 30);
    rig.setLink("prefill-node", false);
    await Promise.race([done, new Promise((r) => setTimeout(r, 2 * KV_TIMEOUT_MS))]);
    rig.setLink("prefill-node", true);
    rig.shape("prefill-node", "1gbit");
    await Promise.race([done, new Promise((r) => setTimeout(r, 30_000))]);
    const ms = Date.now() - t0;
    console.log(`link cut mid-request: the client got ${JSON.stringify(out.slice(0, 300))} after ${ms} ms`);
    // bounded: an error (OpenAI body with a type) well within the gateway's own timeouts, not a hang
    expect(client.exitCode).toBe(0);
    const status = Number(out.split(" ")[0]);
    expect(status).toBeGreaterThanOrEqual(500);
    expect(JSON.parse(out.slice(out.indexOf(" ") + 1)).error.type).toBeTruthy();
    expect(ms).toBeLessThan(30_000);
    // nothing left: no lease on either worker, and no blob in the relay (long before its TTL)
    const held = () =>
      [
        gauge("relay-node", `http://${ip("relay-node")}:9400/metrics`, "airm_kv_relay_blobs"),
        gauge("prefill-node", `http://${ip("prefill-node")}:8101/metrics`, "airm_kv_leases_outstanding"),
        gauge("decode-node", `http://${ip("decode-node")}:8102/metrics`, "airm_kv_leases_outstanding"),
      ].join(" / ");
    console.log(`held after the error (relay blobs / prefill leases / decode leases): ${held()}`);
    const late = () => gauge("relay-node", `http://${ip("relay-node")}:9400/metrics`, "airm_kv_relay_late_pushes_total");
    await until(
      "the relay and the workers hold nothing",
      () =>
        gauge("relay-node", `http://${ip("relay-node")}:9400/metrics`, "airm_kv_relay_blobs") === 0 &&
        gauge("prefill-node", `http://${ip("prefill-node")}:8101/metrics`, "airm_kv_leases_outstanding") === 0 &&
        gauge("decode-node", `http://${ip("decode-node")}:8102/metrics`, "airm_kv_leases_outstanding") === 0,
      30,
    );
    console.log(`pushes the relay dropped as late (their request was released first): ${late()}`);
    // and the next request is answered whole
    const next = JSON.parse(fetchIn(rig, "gateway-node", `${gw}/v1/completions`, req));
    expect(next.usage.completion_tokens).toBe(8);
  }, 90_000);

  it("a black-holed relay host (its address gone, its links up: nothing answers, nothing refuses) gives a bounded error, and requests are whole once it is back", async () => {
    const ip = (h: string) => rig.host(h).address;
    const gw = `http://${ip("gateway-node")}:8000`;
    const model = JSON.parse(fetchIn(rig, "gateway-node", `${gw}/v1/models`)).data[0].id;
    const req = { model, prompt: "Pack my box with five dozen liquor jugs", max_tokens: 8, temperature: 0 };
    const want = JSON.parse(fetchIn(rig, "gateway-node", `${gw}/v1/completions`, req)).choices[0].text;
    // the workers' pooled connections to the relay stay open: their segments now go unanswered
    rig.sh("relay-node", "ip", ["addr", "del", `${ip("relay-node")}/24`, "dev", "eth0"]);
    let r: ReturnType<typeof postIn>;
    try {
      r = postIn(rig, "gateway-node", `${gw}/v1/completions`, req, 60);
    } finally {
      rig.sh("relay-node", "ip", ["addr", "add", `${ip("relay-node")}/24`, "dev", "eth0"]);
    }
    console.log(`black-holed relay: the client got ${r.status} ${r.body.slice(0, 300)} after ${r.ms} ms`);
    expect(r.status).toBeGreaterThanOrEqual(500);
    expect(JSON.parse(r.body).error.code).toMatch(/^kv_/);
    expect(r.ms).toBeLessThan(30_000);
    // back: the next requests are whole (the first may still meet a connection the outage broke)
    let next: ReturnType<typeof postIn> | undefined;
    await until(
      "a request is answered whole after the relay host is back",
      () => {
        next = postIn(rig, "gateway-node", `${gw}/v1/completions`, req, 30);
        return next.status === 200;
      },
      60,
    );
    expect(JSON.parse(next!.body).choices[0].text).toBe(want);
    const gauge = (host: string, url: string, name: string) => Number(new RegExp(`^${name}(?:\\{[^}]*\\})? (\\S+)$`, "m").exec(fetchIn(rig, host, url))?.[1]);
    await until(
      "the workers hold no lease",
      () =>
        gauge("prefill-node", `http://${ip("prefill-node")}:8101/metrics`, "airm_kv_leases_outstanding") === 0 &&
        gauge("decode-node", `http://${ip("decode-node")}:8102/metrics`, "airm_kv_leases_outstanding") === 0,
      30,
    );
  }, 180_000);
});
