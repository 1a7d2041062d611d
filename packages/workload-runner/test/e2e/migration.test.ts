// Request migration with real processes: a cluster as airm up runs it (parts restarted when they
// die) with one prefill and two decode workers. Eight streamed completions (four greedy, four
// sampled with a seed at temperature 0.8; 200 tokens each, ignore_eos) run once undisturbed, then
// again while one decode worker is killed (SIGKILL) mid-stream. Every client gets its whole
// answer, with no error, and each stream's text and token ids (log-probabilities with
// return_tokens_as_token_ids) are byte-identical to the undisturbed run; the gateway counts the
// migrations. The same when the decode worker is told to stop (SIGTERM: it drains and hands its
// streams back), and a prefill worker killed after the first tokens costs nothing. A migration
// limit of 0 gives the client the error instead.
import { rmSync } from "node:fs";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { sseEvents, type RunningCluster } from "../../src/index.ts";
import { cluster, health, modelId, tinyModel, until, SLOW_MODEL } from "../helpers/cluster.ts";

const S = 512;
const TOKENS = 200;
let model: string;
const clusters: RunningCluster[] = [];

beforeAll(() => {
  // Big enough that 8 streams of 200 tokens take a few seconds on the CPU path, so the kill lands mid-stream.
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
  ids: string[];
  finish: string | null;
  errors: unknown[];
  ids0: Set<string>;
  done: boolean;
  usage: unknown;
}

const bodies = (id: string) =>
  Array.from({ length: 8 }, (_, i) => ({
    model: id,
    prompt: `Stream ${i} tells a story about the number ${i * 7}:`,
    max_tokens: TOKENS,
    ignore_eos: true,
    stream: true,
    stream_options: { include_usage: true },
    logprobs: 0,
    return_tokens_as_token_ids: true,
    ...(i < 4 ? { temperature: 0 } : { temperature: 0.8, seed: 1000 + i }),
  }));

/** Sends one streamed completion; `progress` counts its tokens as they arrive. */
async function stream(url: string, body: unknown, progress: (n: number) => void): Promise<Stream> {
  const r = await fetch(`${url}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
  const out: Stream = { status: r.status, text: "", ids: [], finish: null, errors: [], ids0: new Set(), done: false, usage: null };
  if (r.status !== 200) {
    out.errors.push(await r.text());
    return out;
  }
  for await (const chunk of sseEvents<any>(r.body!, { onDone: () => (out.done = true) })) {
    if (chunk.error) {
      out.errors.push(chunk.error);
      continue;
    }
    out.ids0.add(chunk.id);
    if (chunk.usage) out.usage = chunk.usage;
    for (const c of chunk.choices ?? []) {
      out.text += c.text ?? "";
      out.ids.push(...(c.logprobs?.tokens ?? []));
      if (c.finish_reason) out.finish = c.finish_reason;
    }
    progress(out.ids.length);
  }
  return out;
}

/** Runs the eight streams; `during` runs once every stream has at least `after` tokens. */
async function runAll(c: RunningCluster, id: string, during?: () => Promise<void>, after = 20): Promise<Stream[]> {
  const seen = new Array(8).fill(0);
  const runs = bodies(id).map((b, i) => stream(c.url, b, (n) => (seen[i] = n)));
  if (during) {
    await until(() => seen.every((n) => n >= after), "every stream past its first tokens", 120_000, 5);
    await during();
  }
  return Promise.all(runs);
}

async function migrations(c: RunningCluster): Promise<number> {
  const text = await (await fetch(`${c.url}/metrics`)).text();
  return [...text.matchAll(/^airm_migrations_total\{[^}]*\} (\d+)/gm)].reduce((a, m) => a + Number(m[1]), 0);
}

function expectWhole(runs: Stream[]): void {
  for (const [i, r] of runs.entries()) {
    expect(r.errors, `stream ${i}`).toEqual([]);
    expect(r.status).toBe(200);
    expect(r.done, `stream ${i} ends with [DONE]`).toBe(true);
    expect(r.ids0.size, `stream ${i} keeps one id`).toBe(1);
    expect(r.ids.length, `stream ${i}`).toBe(TOKENS);
    expect(r.finish).toBe("length");
    expect(r.usage).toMatchObject({ completion_tokens: TOKENS });
  }
}

describe("request migration", () => {
  it("a decode worker killed mid-stream costs the clients nothing: every stream equals the undisturbed run, token for token", async () => {
    const c = await cluster({ model, maxModelLen: S, decode: [{}, {}], onPartExit: "restart" });
    clusters.push(c);
    const id = await modelId(c);
    const calm = await runAll(c, id);
    expectWhole(calm);
    expect(await migrations(c)).toBe(0);
    // Sampled streams differ from the greedy ones (the seed and temperature are in effect).
    expect(new Set(calm.map((r) => r.text)).size).toBe(8);

    let killed = 0;
    const victim = c.part("decode");
    const disturbed = await runAll(c, id, async () => {
      killed = (await health(victim.url)).requests.running;
      victim.child.kill("SIGKILL");
    });
    expect(killed, "streams running on the killed worker").toBeGreaterThan(0);
    expectWhole(disturbed);
    for (const [i, r] of disturbed.entries()) {
      expect(r.ids, `stream ${i}: token ids`).toEqual(calm[i].ids);
      expect(r.text, `stream ${i}: text`).toBe(calm[i].text);
    }
    // Each stream that ran on the killed worker moved once (it had ~180 tokens left when the kill came).
    expect(await migrations(c)).toBe(killed);
    const metrics = await (await fetch(`${c.url}/metrics`)).text();
    expect(metrics).toMatch(/^airm_migrations_total\{role="decode",reason="worker_stream_broken"\} \d+/m);
    expect(metrics).toMatch(/^airm_migration_seconds_count \d+/m);
    const logs = c.part("gateway").logs();
    expect(logs).toMatch(/stream moves to another worker/);
    expect(logs).toMatch(/"resume_at":\d+/);
  }, 600_000);

  it("a decode worker told to stop (SIGTERM) drains: it hands its streams back, they move and equal the undisturbed run; a prefill worker killed after the first tokens costs nothing", async () => {
    // AIRM_DRAIN_S=0: hand back at once (the default lets streams finish for 10 s first).
    const c = await cluster({ model, maxModelLen: S, decode: [{}, {}], onPartExit: "restart", env: { AIRM_DRAIN_S: "0" } });
    clusters.push(c);
    const id = await modelId(c);
    const calm = await runAll(c, id);
    expectWhole(calm);
    let handed = 0;
    const victim = c.part("decode");
    const drained = await runAll(c, id, async () => {
      handed = (await health(victim.url)).requests.running;
      victim.child.kill("SIGTERM");
    });
    expect(handed).toBeGreaterThan(0);
    expectWhole(drained);
    for (const [i, r] of drained.entries()) expect(r.ids, `stream ${i}: token ids`).toEqual(calm[i].ids);
    const metrics = await (await fetch(`${c.url}/metrics`)).text();
    expect(metrics).toMatch(new RegExp(`^airm_migrations_total\\{role="decode",reason="worker_draining"\\} ${handed}$`, "m"));
    expect(victim.logs()).toMatch(/requests handed back/);

    // The prefill worker's part is done once the first token is out and the KV handed off: its
    // death does not touch the streams (the KV is in the transport), and the one that takes its
    // place after the restart serves the next requests.
    const before = await migrations(c);
    const prefill = c.part("prefill");
    const after = await runAll(c, id, async () => {
      prefill.child.kill("SIGKILL");
    });
    expectWhole(after);
    for (const [i, r] of after.entries()) expect(r.ids, `stream ${i}: token ids`).toEqual(calm[i].ids);
    expect(await migrations(c)).toBe(before);
  }, 600_000);

  it("with AIRM_MIGRATION_LIMIT=0 the client gets the error, as before", async () => {
    const c = await cluster({ model, maxModelLen: S, decode: [{}, {}], onPartExit: "restart", gatewayEnv: { AIRM_MIGRATION_LIMIT: "0", AIRM_HEALTH_INTERVAL_MS: "500" } });
    clusters.push(c);
    const id = await modelId(c);
    const victim = c.part("decode");
    const runs = await runAll(c, id, async () => {
      victim.child.kill("SIGKILL");
    });
    const broken = runs.filter((r) => r.errors.length > 0);
    expect(broken.length).toBeGreaterThan(0);
    for (const r of broken) expect(JSON.stringify(r.errors)).toMatch(/worker_stream_broken/);
    expect(await migrations(c)).toBe(0);
  }, 600_000);
});
