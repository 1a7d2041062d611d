import { describe, expect, test } from "vitest";
import { readFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { freePort, planCluster } from "./cluster-plan.ts";
import { UP_COMMAND, upCluster } from "./up-command.ts";

const flag = (argv: string[], name: string) => argv[argv.indexOf(name) + 1];

describe("planCluster: what the transport declares decides the parts", () => {
  test("shm: no sidecar, a per-cluster folder in PD_SHM_ROOT for every part, workers then gateway", async () => {
    const plan = await planCluster({ model: "/m", kvTransport: "shm" }, 4242);
    expect(plan.parts.map((p) => p.name)).toEqual(["prefill", "decode", "gateway"]);
    expect(plan.clusterDir).toEqual({ env: "PD_SHM_ROOT", under: "/dev/shm", prefix: "airm-up-", path: "/dev/shm/airm-up-4242" });
    for (const p of plan.parts) expect(p.env).toMatchObject({ PD_SHM_ROOT: "/dev/shm/airm-up-4242", AIRM_KV_TRANSPORT: "shm" });
    expect(flag(plan.parts[0].argv, "--backend")).toBe("rngd-full");
    expect(flag(plan.parts[1].argv, "--backend")).toBe("atom");
    expect(flag(plan.parts[2].argv, "--prefill")).toBe("http://127.0.0.1:8101");
  });

  test("tcp and nixl-ucx: the kv-relay sidecar they declare, first, its address in AIRM_KV_TCP_ADDR", async () => {
    for (const kv of ["tcp", "nixl-ucx"]) {
      const plan = await planCluster({ model: "/m", kvTransport: kv, sidecarPort: 7411 }, 1);
      const [relay, ...rest] = plan.parts;
      expect(relay.name).toBe("kv-relay");
      expect(relay.argv[1]).toMatch(/kv-relay\/bin\/airm-kv-relay\.mjs$/);
      expect(relay.argv.slice(2)).toEqual(["--listen", "127.0.0.1:7411"]);
      expect(relay.ready).toBe("connect");
      for (const p of rest) expect(p.env.AIRM_KV_TCP_ADDR).toBe("127.0.0.1:7411");
      expect(plan.clusterDir).toBeNull();
    }
  });

  test("replicas are named and get their own ports; solo mode has no transport", async () => {
    const plan = await planCluster({ model: "/m", prefill: [{}, { backend: "rngd-chunk" }], decode: [{}, {}, { batch: 4 }] }, 1);
    expect(plan.parts.map((p) => p.name)).toEqual(["prefill", "prefill-2", "decode", "decode-2", "decode-3", "gateway"]);
    expect(plan.ports.map((p) => p.port)).toEqual([8101, 8103, 8102, 8104, 8106, 8000]);
    expect(flag(plan.parts[4].argv, "--B")).toBe("4");
    expect(flag(plan.parts[5].argv, "--decode")).toBe("http://127.0.0.1:8102,http://127.0.0.1:8104,http://127.0.0.1:8106");
    const solo = await planCluster({ model: "/m", mode: "solo", gateway: false }, 1);
    expect(solo.parts.map((p) => p.name)).toEqual(["solo"]);
    expect(solo.transport).toBeNull();
  });

  test("a core board: every worker gets its own slot in one file, the gateway none; airm up's auto decode threads use it", async () => {
    const plan = await planCluster(
      {
        model: "/m",
        coreBoard: true,
        decode: [
          { threads: 2, secondThread: "when-idle" },
          { threads: 2, secondThread: "when-idle" },
        ],
      },
      77,
    );
    expect(plan.coreBoard).toEqual({ under: tmpdir(), prefix: "airm-cores-", path: join(tmpdir(), "airm-cores-77") });
    const board = (name: string) => plan.parts.find((p) => p.name === name)!.env;
    expect([board("prefill"), board("decode"), board("decode-2")].map((e) => e.AIRM_CORE_BOARD)).toEqual([0, 1, 2].map((i) => `${join(tmpdir(), "airm-cores-77")}:${i}`));
    expect([board("prefill"), board("decode"), board("decode-2")].map((e) => e.AIRM_SECOND_THREAD)).toEqual([undefined, "when-idle", "when-idle"]);
    expect(board("gateway").AIRM_CORE_BOARD).toBeUndefined();
    expect((await planCluster({ model: "/m" }, 77)).coreBoard).toBeNull();
    const up = (argv: string[]) => upCluster(UP_COMMAND.parse(argv).values, "/m");
    expect(up(["--decode-threads", "auto"])).toMatchObject({
      coreBoard: true,
      decode: [
        { threads: 2, secondThread: "when-idle" },
        { threads: 2, secondThread: "when-idle" },
      ],
    });
    expect(up(["--decode-threads", "2"])).toMatchObject({ coreBoard: false, decode: [{ threads: 2 }, { threads: 2 }] });
    expect(up(["--decode-threads", "2"]).decode![0]!.secondThread).toBeUndefined();
  });

  test("a transport or backend that is not installed is refused with what is", async () => {
    await expect(planCluster({ model: "/m", kvTransport: "carrier-pigeon" }, 1)).rejects.toMatchObject({
      code: "UNKNOWN_PLUGIN",
      message: expect.stringMatching(/installed: .*shm/),
    });
    await expect(planCluster({ model: "/m", decode: [{ backend: "tpu" }] }, 1)).rejects.toMatchObject({ code: "CONFIG", message: expect.stringContaining("unknown backend") });
  });
});

describe("freePort", () => {
  test("picks bindable ports below Linux's ephemeral range, so an outgoing connection cannot take one before its part binds it", async () => {
    const [lo] = readFileSync("/proc/sys/net/ipv4/ip_local_port_range", "utf8").trim().split(/\s+/).map(Number);
    const ports = await Promise.all(Array.from({ length: 8 }, () => freePort()));
    for (const port of ports) {
      expect(port).toBeGreaterThanOrEqual(10_000);
      expect(port).toBeLessThan(lo);
      const s = createServer();
      await new Promise<void>((resolve, reject) => {
        s.once("error", reject);
        s.listen(port, "127.0.0.1", () => resolve());
      });
      await new Promise((r) => s.close(r));
    }
  });
});
