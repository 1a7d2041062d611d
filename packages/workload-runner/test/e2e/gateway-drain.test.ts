// The gateway's drain with real processes (a PD cluster as airm up runs it). Told to stop
// (SIGTERM) while it streams four long completions, the gateway at once says draining on /health
// (503) and on /metrics (airm_draining 1, for endpoint pickers), refuses a new request with 503 gateway_draining, Retry-After and a closed connection, lets
// the four streams finish whole (every token, [DONE], the same tokens as an undisturbed run), then
// exits 0 by itself. With a drain period too short for the streams, what is left ends with an
// error event gateway_draining (not a cut connection) and the workers are left with no lease and no
// running request. Stopping the cluster (what Ctrl-C on airm up does) stops the gateway first, so
// a stream open at that moment ends whole too.
import { rmSync } from "node:fs";
import { request } from "node:http";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { sseEvents, type RunningCluster } from "../../src/index.ts";
import { cluster, health, modelId, tinyModel, until, SLOW_MODEL } from "../helpers/cluster.ts";

const S = 512;
const TOKENS = 160;
let model: string;
const clusters: RunningCluster[] = [];

beforeAll(() => {
  // Big enough that four streams of 160 tokens take a few seconds on the CPU path.
  model = tinyModel(SLOW_MODEL);
});
afterEach(async () => {
  await Promise.all(clusters.splice(0).map((c) => c.stop()));
});
afterAll(() => {
  if (model) rmSync(model, { recursive: true, force: true });
});

interface Stream {
  status: number;
  text: string;
  /** Text chunks seen. */
  chunks: number;
  /** usage.completion_tokens of the last chunk (0 without one). */
  tokens: number;
  errors: { code?: string }[];
  done: boolean;
}

const body = (id: string, i: number, tokens = TOKENS) => ({
  model: id,
  prompt: `Drain story ${i}:`,
  max_tokens: tokens,
  ignore_eos: true,
  temperature: 0,
  stream: true,
  stream_options: { include_usage: true },
});

/** One streamed completion; `seen` counts its text chunks as they arrive. */
async function stream(url: string, b: unknown, seen: (n: number) => void): Promise<Stream> {
  const r = await fetch(`${url}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(b) });
  const out: Stream = { status: r.status, text: "", chunks: 0, tokens: 0, errors: [], done: false };
  if (r.status !== 200) {
    out.errors.push((await r.json()) as { code?: string });
    return out;
  }
  for await (const chunk of sseEvents<any>(r.body!, { onDone: () => (out.done = true) })) {
    if (chunk.error) out.errors.push(chunk.error);
    if (chunk.usage) out.tokens = chunk.usage.completion_tokens;
    for (const c of chunk.choices ?? []) {
      out.text += c.text ?? "";
      out.chunks++;
    }
    seen(out.chunks);
  }
  return out;
}

/**
 * One request on a connection of its own (a draining gateway closes idle kept-open connections, and
 * a request sent on one as it closes would fail with a reset: the client's race, not the gateway's).
 */
function fresh(url: string, method = "GET", payload?: unknown): Promise<{ status: number; headers: Record<string, unknown>; text: string; body: any }> {
  return new Promise((resolve, reject) => {
    const req = request(url, { method, agent: false, headers: { "content-type": "application/json" } }, (res) => {
      let text = "";
      res.setEncoding("utf8");
      res.on("data", (d: string) => (text += d));
      res.on("end", () => resolve({ status: res.statusCode!, headers: res.headers, text, body: /json/.test(String(res.headers["content-type"])) ? JSON.parse(text) : null }));
    });
    req.on("error", reject);
    req.end(payload === undefined ? undefined : JSON.stringify(payload));
  });
}

/** Four streams of `tokens`; `during` runs once each has `after` chunks. */
async function four(url: string, id: string, during?: () => Promise<void>, after = 10, tokens = TOKENS): Promise<Stream[]> {
  const seen = [0, 0, 0, 0];
  const runs = seen.map((_, i) => stream(url, body(id, i, tokens), (n) => (seen[i] = n)));
  if (during) {
    await until(() => seen.every((n) => n >= after), "every stream past its first tokens", 120_000, 5);
    await during();
  }
  return Promise.all(runs);
}

function expectWhole(runs: Stream[], calm: Stream[]): void {
  for (const [i, r] of runs.entries()) {
    expect(r.errors, `stream ${i}`).toEqual([]);
    expect(r.done, `stream ${i} ends with [DONE]`).toBe(true);
    expect(r.tokens, `stream ${i}`).toBe(TOKENS);
    expect(r.text, `stream ${i}: the undisturbed run's text`).toBe(calm[i]!.text);
  }
}

describe("gateway drain", () => {
  it("SIGTERM: /health says draining, a new request gets 503 gateway_draining with Retry-After, the open streams end whole, then the gateway exits 0", async () => {
    const c = await cluster({ model, maxModelLen: S, gatewayEnv: { AIRM_DRAIN_S: "60", AIRM_HEALTH_INTERVAL_MS: "500" } });
    clusters.push(c);
    const id = await modelId(c);
    const calm = await four(c.url, id);
    const gateway = c.part("gateway");
    let refused: Awaited<ReturnType<typeof fresh>> | undefined;
    let probe: Awaited<ReturnType<typeof fresh>> | undefined;
    let metricsText = "";
    const runs = await four(c.url, id, async () => {
      gateway.child.kill("SIGTERM");
      await until(async () => (await fresh(`${c.url}/health`)).status === 503, "the gateway to say it drains", 10_000, 5);
      probe = await fresh(`${c.url}/health`);
      metricsText = (await fresh(`${c.url}/metrics`)).text;
      refused = await fresh(`${c.url}/v1/completions`, "POST", body(id, 9));
    });
    expect(probe).toMatchObject({ status: 503, body: { status: "draining" } });
    expect(probe!.body.open_requests).toBeGreaterThan(0);
    // what an endpoint picker that scrapes the gateway sees (ours passes a draining server over)
    expect(metricsText).toMatch(/^airm_draining 1$/m);
    expect(refused).toMatchObject({ status: 503, headers: { "retry-after": "1", connection: "close" }, body: { error: { code: "gateway_draining" } } });
    expectWhole(runs, calm);
    expect(await gateway.exited).toBe(0);
    expect(gateway.logs()).not.toMatch(/drain grace passed/);
  }, 600_000);

  it("a drain period shorter than the streams: what is left ends with an error event gateway_draining, and the workers keep no lease or request", async () => {
    const c = await cluster({ model, maxModelLen: S, gatewayEnv: { AIRM_DRAIN_S: "1", AIRM_HEALTH_INTERVAL_MS: "500" } });
    clusters.push(c);
    const id = await modelId(c);
    const gateway = c.part("gateway");
    // Streams of 480 tokens: far longer than the 1 s the gateway gives them.
    const runs = await four(
      c.url,
      id,
      async () => {
        gateway.child.kill("SIGTERM");
      },
      10,
      480,
    );
    for (const [i, r] of runs.entries()) {
      expect(r.status).toBe(200);
      expect(
        r.errors.map((e) => e.code),
        `stream ${i}: an error event, then [DONE]`,
      ).toEqual(["gateway_draining"]);
      expect(r.done).toBe(true);
      expect(r.tokens, `stream ${i}: no usage chunk, the answer was not whole`).toBe(0);
    }
    expect(await gateway.exited).toBe(0);
    expect(gateway.logs()).toMatch(/drain grace passed/);
    for (const role of ["prefill", "decode"]) {
      await until(async () => (await health(c.part(role).url)).requests.running === 0, `the ${role} worker idle`, 20_000);
      expect((await health(c.part(role).url)).leases.outstanding, role).toBe(0);
    }
  }, 600_000);

  it("stopping the cluster (airm up's Ctrl-C) stops the gateway first: a stream open then ends whole", async () => {
    // Workers that hand their streams back at once (AIRM_DRAIN_S=0): stopped before the gateway,
    // they would break the streams, as no other worker is left to move them to.
    const c = await cluster({
      model,
      maxModelLen: S,
      env: { AIRM_DRAIN_S: "0" },
      gatewayEnv: { AIRM_DRAIN_S: "60", AIRM_LOG_LEVEL: "info", AIRM_HEALTH_INTERVAL_MS: "500" },
    });
    clusters.push(c);
    const id = await modelId(c);
    const calm = await four(c.url, id);
    let stopped: Promise<void> | undefined;
    const runs = await four(c.url, id, async () => {
      stopped = c.stop("test: stop under load");
    });
    await stopped;
    expectWhole(runs, calm);
    expect(c.part("gateway").logs()).toMatch(/draining: no new requests/);
  }, 600_000);
});
