import { afterEach, describe, expect, test } from "vitest";
import { FencedTransport, Registry, defineConfig, flag, kvTransportSuite, opt, selectTransport, transportName, isAirmError, type KVTransportPlugin } from "../src/index.ts";
import { HostCopyTransport, mapTransport } from "./fixtures/memory-transports.ts";

describe("FencedTransport over a copy-only transport (one process)", () => {
  // producer and consumer share one fenced endpoint: the copy handles live in the process
  const shared = () => {
    const t = new FencedTransport(new HostCopyTransport());
    return async () => Object.assign(Object.create(t), { close: async () => {} }) as FencedTransport;
  };
  kvTransportSuite({ test, factory: shared() });

  test("split across endpoints (as across pods) a pull times out and says why", async () => {
    const producer = new FencedTransport(new HostCopyTransport());
    const consumer = new FencedTransport(new HostCopyTransport());
    await producer.push("r/0/k", new Uint8Array([1, 2, 3]));
    const err = await consumer.pull("r/0/k", { timeoutMs: 100 }).catch((e) => e);
    expect(isAirmError(err, "TRANSPORT_TIMEOUT")).toBe(true);
    expect(err.message).toMatch(/one process/);
  });

  test("release reaches the wrapped transport", async () => {
    const inner = new HostCopyTransport();
    const t = new FencedTransport(inner);
    await t.push("r9/0/k", new Uint8Array(4));
    await t.release("r9");
    expect(inner.released).toEqual(["r9"]);
    expect(t.stats().blobs).toBe(0);
  });
});

describe("the conformance kit can fail", () => {
  // a transport that flips a bit must not pass the byte-exact cases
  const results: string[] = [];
  const store = new Map<string, Uint8Array>();
  const record = (name: string, fn: () => Promise<void>) => {
    test(name, async () => {
      const ok = await fn().then(
        () => true,
        () => false,
      );
      results.push(`${name.split(":")[0]}=${ok ? "pass" : "fail"}`);
    });
  };
  const recordingTest = Object.assign(record, { skipIf: () => record });
  kvTransportSuite({ test: recordingTest, factory: async () => mapTransport(store, true) });
  test("byte-exact cases failed on the corrupting transport", () => {
    expect(results).toContain("roundtrip-1mib=fail");
    expect(results).toContain("request-64-blobs=fail");
    expect(results).toContain("bad-keys-rejected=pass");
  });
});

describe("a case the plugin declares it cannot run", () => {
  const ran: string[] = [];
  const skipped: string[] = [];
  const declare = Object.assign((name: string) => void ran.push(name), {
    skipIf: (skip: boolean) => (name: string) => void (skip ? skipped : ran).push(name),
  });
  kvTransportSuite({ test: declare, factory: async () => mapTransport(new Map(), false), skip: { "roundtrip-1b": "no 1-byte blobs here" } });
  test("is declared skipped with its reason, and only that one", () => {
    expect(skipped).toEqual([expect.stringMatching(/^roundtrip-1b: .*\(skipped: no 1-byte blobs here\)$/)]);
    expect(ran.some((n) => n.startsWith("roundtrip-1b:"))).toBe(false);
    expect(ran.length).toBeGreaterThan(5);
  });
  test("a skip without a reason, or of a case that does not exist, is refused", () => {
    const factory = async () => mapTransport(new Map(), false);
    expect(() => kvTransportSuite({ test: declare, factory, skip: { "roundtrip-1b": " " } })).toThrow(/needs a reason/);
    expect(() => kvTransportSuite({ test: declare, factory, skip: { "no-such-case": "why" } })).toThrow(/not a conformance case/);
  });
});

describe("selectTransport", () => {
  const env = { ...process.env };
  afterEach(() => {
    process.env = { ...env };
  });
  function registryWith(...plugins: KVTransportPlugin[]): Registry {
    const r = new Registry({ discover: false });
    for (const p of plugins) r.register("airm.kv_transports", p);
    return r;
  }
  const support = { scope: ["same-host" as const], tiers: ["host-dram" as const], dtypes: ["bf16" as const], layouts: ["rngd-pd/v1"], copyOnly: false };
  const none = defineConfig("fixture", {});
  const plain = (name: string): KVTransportPlugin => ({ kind: "kv_transport", name, support, config: none, create: async () => ({ ...mapTransport(), name }) });
  const copyOnly: KVTransportPlugin = { kind: "kv_transport", name: "p2p", support: { ...support, copyOnly: true }, config: none, create: async () => new HostCopyTransport() };

  test("explicit name, else AIRM_KV_TRANSPORT, else shm", async () => {
    expect(transportName({ env: {} })).toBe("shm");
    expect(transportName({ env: { AIRM_KV_TRANSPORT: "tcp" } })).toBe("tcp");
    expect(transportName({ name: "nixl-ucx", env: { AIRM_KV_TRANSPORT: "tcp" } })).toBe("nixl-ucx");
    const r = registryWith(plain("shm"), plain("tcp"));
    expect((await selectTransport({ registry: r, env: {} })).name).toBe("shm");
    expect((await selectTransport({ registry: r, env: { AIRM_KV_TRANSPORT: "tcp" } })).name).toBe("tcp");
    expect((await selectTransport({ registry: r, name: "shm", env: { AIRM_KV_TRANSPORT: "tcp" } })).name).toBe("shm");
  });

  test("copy-only transports come back fenced", async () => {
    const t = await selectTransport({ registry: registryWith(copyOnly), name: "p2p" });
    expect(t).toBeInstanceOf(FencedTransport);
    expect(t.support.copyOnly).toBe(false);
  });

  test("the plugin's options come from its config: explicit options win over the environment; bad ones are named", async () => {
    const seen: unknown[] = [];
    const config = defineConfig("fixture opts", { fast: opt(flag(), { env: "FIXTURE_FAST", default: false, doc: "go fast" }) });
    const p: KVTransportPlugin<typeof config.options> = {
      kind: "kv_transport",
      name: "opts",
      support,
      config,
      create: async (o) => {
        seen.push(o);
        return mapTransport();
      },
    };
    const r = registryWith(p as KVTransportPlugin);
    await selectTransport({ registry: r, name: "opts", env: {} });
    await selectTransport({ registry: r, name: "opts", env: { FIXTURE_FAST: "1" } });
    await selectTransport({ registry: r, name: "opts", env: { FIXTURE_FAST: "1" }, options: { fast: false } });
    expect(seen).toEqual([{ fast: false }, { fast: true }, { fast: false }]);
    const bad = await selectTransport({ registry: r, name: "opts", env: { FIXTURE_FAST: "maybe" } }).catch((e) => e);
    expect([bad.code, bad.key]).toEqual(["CONFIG", "FIXTURE_FAST"]);
    const unknown = await selectTransport({ registry: r, name: "opts", options: { slow: true } }).catch((e) => e);
    expect([unknown.code, unknown.key]).toEqual(["CONFIG", "slow"]);
  });

  test("an unknown name never falls back", async () => {
    const err = await selectTransport({ registry: registryWith(plain("shm")), name: "rdma" }).catch((e) => e);
    expect(isAirmError(err, "UNKNOWN_PLUGIN")).toBe(true);
    expect(err.message).toContain("installed: shm");
  });
});
