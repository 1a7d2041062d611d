import { expect, test } from "vitest";
import type { Endpoint, Role } from "@airm/routing";
import type { EndpointState } from "./metrics-scraper.ts";
import { Picker } from "./picker.ts";
import type { ServerLoad } from "./prometheus-text.ts";

const clock = 10_000;
const now = () => clock;

function state(n: number, role: Role, load: Partial<ServerLoad> | null, over: Partial<EndpointState> = {}): EndpointState {
  const endpoint: Endpoint = { address: `10.0.0.${n}`, port: 8000, role, name: `pod-${n}` };
  return {
    endpoint,
    key: `10.0.0.${n}:8000`,
    load: load && { waiting: 0, running: 0, kvUsage: 0, ...load },
    scrapedAt: clock,
    error: null,
    picks: 0,
    picksAtScrape: 0,
    scraping: false,
    scheme: "http",
    ...over,
  };
}
const pickerOf = (states: EndpointState[]) => new Picker({ states: () => states }, { now });
const long = (seed: string) => seed.repeat(600);

test("the least loaded decode endpoint wins; picks not yet scraped spread a burst", () => {
  const s = [state(1, "decode", { waiting: 2 }), state(2, "decode", { waiting: 0 }), state(3, "decode", { waiting: 1 })];
  const p = pickerOf(s);
  const first = p.pick("m", "x");
  expect(first.ok && [first.destination.key, first.reason, first.prefill]).toEqual(["10.0.0.2:8000", "least_loaded", null]);
  const burst = Array.from({ length: 6 }, () => p.pick("m", "x")).map((r) => (r.ok ? r.destination.endpoint.name : r.code));
  expect(new Set(burst).size).toBe(3);
  expect(s.map((x) => x.picks).reduce((a, b) => a + b)).toBe(7);
});

test("stale and failing endpoints are skipped; all of them stale is a 503 that says why", () => {
  const stale = state(1, "decode", { waiting: 0 }, { scrapedAt: clock - 2001 });
  const failing = state(2, "decode", { waiting: 0 }, { error: "connect ECONNREFUSED" });
  const fresh = state(3, "decode", { waiting: 4 });
  const r = pickerOf([stale, failing, fresh]).pick("m", "x");
  expect(r.ok && r.destination.key).toBe("10.0.0.3:8000");
  const none = pickerOf([stale, failing, state(4, "decode", null)]).pick("m", "x");
  expect(none.ok).toBe(false);
  if (!none.ok) {
    expect([none.status, none.code]).toEqual([503, "no_ready_endpoints"]);
    expect(none.message).toMatch(/pod-1 .*2001 ms old.*pod-2 .*ECONNREFUSED.*pod-4 .*not scraped yet/);
  }
  const empty = pickerOf([state(5, "prefill", {})]).pick("m", "x");
  expect(!empty.ok && [empty.status, empty.code]).toEqual([503, "no_endpoints"]);
});

test("saturated endpoints are skipped; all saturated is a 429", () => {
  const s = [state(1, "decode", { waiting: 6 }), state(2, "decode", { kvUsage: 0.9 }), state(3, "decode", { waiting: 5, kvUsage: 0.8 })];
  const r = pickerOf(s).pick("m", "x");
  expect(r.ok && r.destination.key).toBe("10.0.0.3:8000");
  const full = pickerOf(s.slice(0, 2)).pick("m", "x");
  expect(!full.ok && [full.status, full.code]).toEqual([429, "all_endpoints_saturated"]);
});

test("a decode-only destination gets a prefill endpoint, chosen by load and prefix affinity", () => {
  const s = [state(1, "decode", {}), state(2, "prefill", { waiting: 1 }), state(3, "prefill", { waiting: 0 })];
  const p = pickerOf(s);
  const a = p.pick("m", long("abc"));
  expect(a.ok && [a.destination.key, a.prefill?.key, a.prefillReason]).toEqual(["10.0.0.1:8000", "10.0.0.3:8000", "least_loaded"]);
  // The same prompt prefix goes back to pod 3 even once it is the busier one (but not saturated).
  s[2].load = { waiting: 4, running: 6, kvUsage: 0.7 };
  const b = p.pick("m", `${long("abc")} and more`);
  expect(b.ok && [b.prefill?.key, b.prefillReason]).toEqual(["10.0.0.3:8000", "prefix_affinity"]);
  s[2].load = { waiting: 6, running: 6, kvUsage: 0.7 };
  const c = p.pick("m", long("abc"));
  expect(c.ok && [c.prefill?.key, c.prefillReason]).toEqual(["10.0.0.2:8000", "only_candidate"]);
});

test("'both' destinations prefill themselves and get prefix affinity; decode-only ones need a prefill endpoint", () => {
  const s = [state(1, "both", { waiting: 0 }), state(2, "both", { waiting: 0 })];
  const p = pickerOf(s);
  const first = p.pick("m", long("xyz"));
  const again = Array.from({ length: 3 }, () => p.pick("m", long("xyz")));
  for (const r of again) expect(r.ok && [r.destination.key, r.reason, r.prefill]).toEqual([first.ok && first.destination.key, "prefix_affinity", null]);
  // Prefill endpoints exist but none is ready: decode-only endpoints cannot serve, "both" still can.
  const mixed = [state(3, "decode", {}), state(4, "prefill", null, { error: "down" }), state(5, "both", { waiting: 3 })];
  const m = pickerOf(mixed).pick("m", "x");
  expect(m.ok && [m.destination.key, m.prefill]).toEqual(["10.0.0.5:8000", null]);
  const noBoth = pickerOf(mixed.slice(0, 2)).pick("m", "x");
  expect(!noBoth.ok && [noBoth.status, noBoth.code]).toEqual([503, "no_ready_endpoints"]);
  expect(!noBoth.ok && noBoth.message).toMatch(/no prefill endpoint is ready/);
});

test("pickAny takes fresh decode-capable endpoints in turn, else any known one", () => {
  const s = [state(1, "decode", {}), state(2, "prefill", {}), state(3, "both", {}), state(4, "decode", null, { error: "down" })];
  const p = pickerOf(s);
  expect([p.pickAny(), p.pickAny(), p.pickAny()].map((x) => x?.endpoint.name)).toEqual(["pod-1", "pod-3", "pod-1"]);
  expect(pickerOf([s[3]]).pickAny()?.endpoint.name).toBe("pod-4");
  expect(pickerOf([s[1]]).pickAny()).toBeNull();
});

test("with disaggregation prompt-length, a short prompt names no prefill endpoint (the decode pod prefills it); a longer one does", () => {
  const s = [state(1, "prefill", {}), state(2, "decode", {})];
  const p = new Picker({ states: () => s }, { now, localPrefillMaxTokens: 16, disaggregation: "prompt-length" });
  const short = p.pick("m", "x".repeat(64)); // 16 tokens estimated
  expect(short.ok && [short.destination.key, short.prefill, short.local]).toEqual(["10.0.0.2:8000", null, true]);
  const longer = p.pick("m", "x".repeat(65)); // 17
  expect(longer.ok && [longer.prefill?.key, longer.local]).toEqual(["10.0.0.1:8000", false]);
  // Off by default: every request to a decode pod gets a prefill pod.
  const off = pickerOf(s).pick("m", "x");
  expect(off.ok && [off.prefill?.key, off.local]).toEqual(["10.0.0.1:8000", false]);
  // A "both" destination prefills itself anyway; it is not counted as a local decision.
  const both = new Picker({ states: () => [state(3, "both", {})] }, { now, localPrefillMaxTokens: 16, disaggregation: "prompt-length" }).pick("m", "x");
  expect(both.ok && [both.prefill, both.local]).toEqual([null, false]);
  // the threshold belongs to its rule
  expect(() => new Picker({ states: () => s }, { now, localPrefillMaxTokens: 16 })).toThrow(/prompt-length/);
});

test("auto (the default): a decode pod that prefills locally gets a prefill pod only when the KV is predicted to arrive sooner", () => {
  const local = { fixedMs: 5, msPerToken: 1 }; // the decode pod's own prefill: 261 ms for 256 tokens
  const remote = { fixedMs: 5, msPerToken: 0.25 }; // the prefill pod's: 69 ms
  const decodeAt = (kvBandwidth: number | undefined) =>
    state(2, "decode", { estimates: { localPrefill: true, kvBytes: 10e6, ...(kvBandwidth ? { kvBandwidth } : {}), prefill: local } });
  const pick = (dest: EndpointState, prompt: string) =>
    new Picker({ states: () => [state(1, "prefill", { estimates: { localPrefill: false, prefill: remote } }), dest] }, { now }).pick("m", prompt);
  const p256 = "x".repeat(256 * 4);
  // 10 MB at 1 GB/s: 10 ms, the remote 69 ms -> ship
  const fast = pick(decodeAt(1e9), p256);
  expect(fast.ok && [fast.prefill?.key, fast.local, fast.path?.reason]).toEqual(["10.0.0.1:8000", false, "kv_faster"]);
  expect(fast.ok && fast.path?.decision?.pdMs).toBeCloseTo(69, 9);
  // at 12.5 MB/s (100 Mbit/s): 800 ms -> the decode pod prefills it
  const slow = pick(decodeAt(12.5e6), p256);
  expect(slow.ok && [slow.prefill, slow.local, slow.path?.reason]).toEqual([null, true, "local_faster"]);
  // nothing measured yet: the KV path is tried first
  const fresh = pick(decodeAt(undefined), p256);
  expect(fresh.ok && [fresh.prefill?.key, fresh.path?.reason]).toEqual(["10.0.0.1:8000", "explore_kv"]);
  // a decode pod without the local path (no airm_worker_local_prefill 1, or not our worker) always gets a prefill pod
  const plain = pick(state(2, "decode", {}), p256);
  expect(plain.ok && [plain.prefill?.key, plain.local, plain.path?.reason]).toEqual(["10.0.0.1:8000", false, "forced"]);
  // always: every request ships
  const always = new Picker({ states: () => [state(1, "prefill", {}), decodeAt(12.5e6)] }, { now, disaggregation: "always" }).pick("m", p256);
  expect(always.ok && [always.prefill?.key, always.local]).toEqual(["10.0.0.1:8000", false]);
});

test("the shared mode names: never names no prefill endpoint; load ignores the prefix; random spreads", () => {
  const pd = () => [state(1, "prefill", {}), state(2, "decode", {})];
  const never = new Picker({ states: pd }, { now, disaggregation: "never" }).pick("m", "x");
  expect(never.ok && [never.prefill, never.local, never.path?.reason]).toEqual([null, true, "forced"]);
  const always = new Picker({ states: pd }, { now, disaggregation: "always" }).pick("m", "x");
  expect(always.ok && always.prefill?.key).toBe("10.0.0.1:8000");

  // A prompt both-role endpoint 1 took before: approx-prefix keeps it there though it is busier, load does not.
  const both = [state(1, "both", { running: 3 }), state(2, "both", { running: 0 })];
  for (const [routing, want] of [
    ["approx-prefix", "10.0.0.1:8000"],
    ["load", "10.0.0.2:8000"],
  ] as const) {
    const p = new Picker({ states: () => both }, { now, routing });
    p.prefix.record(p.prefix.hashes("m", long("a")), "10.0.0.1:8000");
    const r = p.pick("m", long("a"));
    expect(r.ok && r.destination.key, routing).toBe(want);
  }
  const random = new Picker({ states: () => [state(1, "decode", {}), state(2, "decode", { running: 5 })] }, { now, routing: "random" });
  const keys = new Set(Array.from({ length: 40 }, () => random.pick("m", "x")).map((r) => (r.ok ? r.destination.key : r.code)));
  expect(keys.size).toBe(2);
});

test("LoRA affinity: a request naming an adapter goes to an endpoint that has it active or waiting, whatever the load; else anywhere", () => {
  const lora = (active: string[], waiting: string[] = []) => ({ maxLoras: 4, active, waiting });
  const s = [
    state(1, "decode", { waiting: 0, lora: lora([]) }),
    state(2, "decode", { waiting: 5, lora: lora(["sql"]) }),
    state(3, "decode", { waiting: 0, lora: lora([], ["chat"]) }),
  ];
  const p = pickerOf(s);
  for (let i = 0; i < 3; i++) {
    const r = p.pick("sql", "x");
    expect(r.ok && r.destination.endpoint.name).toBe("pod-2");
  }
  const chat = p.pick("chat", "x");
  expect(chat.ok && chat.destination.endpoint.name).toBe("pod-3");
  // No endpoint has it: the least loaded, as for the base model.
  const other = p.pick("base", "x");
  expect(other.ok && other.destination.endpoint.name).toBe("pod-1");
});
