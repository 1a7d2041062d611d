import { describe, expect, it } from "vitest";
import { decideDisaggregation, Ewma, PrefillFit, prefillMs, unionMs } from "./disaggregation.ts";

describe("the disaggregation decision's inputs", () => {
  it("fits prefill time as fixed + per token, over the last samples", () => {
    const f = new PrefillFit(4);
    expect(f.model()).toBeNull();
    f.add(100, 60);
    expect(f.model()).toEqual({ fixedMs: 0, msPerToken: 0.6 }); // one length: through the origin
    f.add(200, 110);
    f.add(300, 160);
    const m = f.model()!;
    expect(m.fixedMs).toBeCloseTo(10, 9);
    expect(m.msPerToken).toBeCloseTo(0.5, 9);
    expect(prefillMs(m, 1000)).toBeCloseTo(510, 9);
    // the window forgets: four samples of a slower worker replace these
    for (const n of [100, 200, 300, 400]) f.add(n, 2 * n);
    expect(f.model()!.msPerToken).toBeCloseTo(2, 9);
    expect(f.model()!.fixedMs).toBeCloseTo(0, 9);
  });

  it("ignores samples it cannot use and smooths with an EWMA", () => {
    const f = new PrefillFit();
    f.add(0, 5);
    f.add(10, Number.NaN);
    expect(f.model()).toBeNull();
    const e = new Ewma(0.5);
    expect(e.value).toBeNull();
    e.add(100);
    e.add(0); // not a sample
    e.add(200);
    expect(e.value).toBe(150);
  });

  it("measures the time bytes were moving as the union of the blobs' intervals", () => {
    expect(unionMs([])).toBe(0);
    expect(
      unionMs([
        { startMs: 0, endMs: 10 },
        { startMs: 5, endMs: 12 },
        { startMs: 20, endMs: 25 }, // a wait for the next layer between 12 and 20 is not counted
        { startMs: 21, endMs: 22 },
      ]),
    ).toBe(17);
  });
});

describe("decideDisaggregation", () => {
  const same = { fixedMs: 5, msPerToken: 1 };
  it("explores what it has not measured: the KV path first, then the local prefill", () => {
    expect(decideDisaggregation({ promptTokens: 100, bandwidth: null, kvBytes: null, remote: same, local: same })).toEqual({ ship: true, reason: "explore_kv" });
    expect(decideDisaggregation({ promptTokens: 100, bandwidth: 1e9, kvBytes: 1e6, remote: same, local: null })).toEqual({ ship: false, reason: "explore_local" });
  });

  it("ships when max(remote prefill, transfer) beats the local prefill", () => {
    const fastRemote = { fixedMs: 5, msPerToken: 0.25 };
    // 256 tokens: local 261 ms; remote 69 ms; 10 MB at 1 GB/s = 10 ms -> PD 69 ms
    const d = decideDisaggregation({ promptTokens: 256, bandwidth: 1e9, kvBytes: 10e6, remote: fastRemote, local: same });
    expect(d).toMatchObject({ ship: true, reason: "kv_faster" });
    expect(d.pdMs).toBeCloseTo(69, 9);
    expect(d.localMs).toBeCloseTo(261, 9);
    // at 12.5 MB/s (100 Mbit/s) the same 10 MB take 800 ms: local
    expect(decideDisaggregation({ promptTokens: 256, bandwidth: 12.5e6, kvBytes: 10e6, remote: fastRemote, local: same })).toMatchObject({
      ship: false,
      reason: "local_faster",
      kvMs: 800,
    });
    // 16 tokens: local 21 ms, the transfer alone 10 ms, the remote 9 ms -> PD 10 ms
    expect(decideDisaggregation({ promptTokens: 16, bandwidth: 1e9, kvBytes: 10e6, remote: fastRemote, local: same }).ship).toBe(true);
  });

  it("predicts a request's bytes from its prompt when the bytes per prompt token are known (paged KV moves the prompt's blocks)", () => {
    const fastRemote = { fixedMs: 5, msPerToken: 0.25 };
    // 40 KB per token: 256 tokens move 10.24 MB, 800+ ms at 12.5 MB/s: local; 16 tokens move 640 KB, 51 ms: still local (21 ms)
    const per = { bandwidth: 12.5e6, kvBytes: 1e3, kvBytesPerToken: 40e3, remote: fastRemote, local: same };
    expect(decideDisaggregation({ promptTokens: 256, ...per })).toMatchObject({ ship: false, kvMs: 819.2 });
    // at 1 GB/s the same 256 tokens take 10.24 ms: PD (69 ms) beats local (261 ms)
    expect(decideDisaggregation({ promptTokens: 256, ...per, bandwidth: 1e9 })).toMatchObject({ ship: true, reason: "kv_faster" });
  });

  it("counts what the decode endpoint holds: those positions neither cross nor are computed locally", () => {
    const fastRemote = { fixedMs: 5, msPerToken: 0.25 };
    const per = { bandwidth: 1e9, kvBytes: 1e3, kvBytesPerToken: 40e3, remote: fastRemote, local: same };
    // 256 tokens, 240 held: 16 cross (0.64 ms), local computes 16 (21 ms); remote still computes all 256 (69 ms): local
    const d = decideDisaggregation({ promptTokens: 256, heldTokens: 240, ...per });
    expect(d).toMatchObject({ ship: false, reason: "local_faster" });
    expect(d.kvMs).toBeCloseTo(0.64, 9);
    expect(d.localMs).toBeCloseTo(21, 9);
    expect(decideDisaggregation({ promptTokens: 256, ...per })).toMatchObject({ ship: true, localMs: 261 });
  });

  it("on equal hardware without a remote model, a tie stays local (nothing has to cross)", () => {
    expect(decideDisaggregation({ promptTokens: 100, bandwidth: 1e12, kvBytes: 1, remote: null, local: same })).toMatchObject({ ship: false, reason: "local_faster" });
  });
});
