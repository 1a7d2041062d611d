// The seed's table for run(workload, config), checked on dry_run output.
import { describe, expect, test } from "vitest";
import { isAirmError, type Workload } from "@airm/rm-core";
import { buildCommand, gatewayArgv, run, workerArgv, type ProcessCommand, type RunConfig } from "./rngd-pd-workload.ts";

const flag = (argv: string[], name: string) => {
  const i = argv.indexOf(name);
  return i < 0 ? undefined : argv[i + 1];
};

async function dry(w: Workload, c: RunConfig = {}): Promise<ProcessCommand> {
  return (await run(w, { ...c, dry_run: true })) as ProcessCommand;
}

describe("rngd-pd run(): dry_run argv/env per kind", () => {
  test("prefill starts an RNGD prefill worker with backend rngd-full", async () => {
    const { argv, env } = await dry({ kind: "prefill", model: "/models/llama" });
    expect(argv[0]).toBe(process.execPath);
    expect(argv[1]).toMatch(/worker\/bin\/airm-worker\.mjs$/);
    expect(flag(argv, "--role")).toBe("prefill");
    expect(flag(argv, "--backend")).toBe("rngd-full");
    expect(flag(argv, "--port")).toBe("8000");
    expect(argv).not.toContain("--max-model-len"); // the model's own context
    expect(argv).not.toContain("--B");
    expect(env).toEqual({ AIRM_KV_TRANSPORT: "shm", MODEL: "/models/llama" });
  });

  test("decode starts an ATOM decode worker; batch_hint becomes --B", async () => {
    const { argv, env } = await dry({ kind: "decode", model: "/m", batch_hint: 8 });
    expect(flag(argv, "--role")).toBe("decode");
    expect(flag(argv, "--backend")).toBe("atom");
    expect(flag(argv, "--B")).toBe("8");
    expect(env.MODEL).toBe("/m");
  });

  test("serve starts the gateway in front of the local prefill/decode workers", async () => {
    const { argv, env } = await dry({ kind: "serve" }, { metrics_port: 9400 });
    expect(argv[1]).toMatch(/gateway\/bin\/airm-gateway\.mjs$/);
    expect(flag(argv, "--port")).toBe("8000");
    expect(flag(argv, "--prefill")).toBe("http://127.0.0.1:8101");
    expect(flag(argv, "--decode")).toBe("http://127.0.0.1:8102");
    expect(env).toEqual({ AIRM_KV_TRANSPORT: "shm", AIRM_METRICS_PORT: "9400" });
  });

  test.each([
    [{ kv_transport: "tcp" }, (c: ProcessCommand) => expect(c.env.AIRM_KV_TRANSPORT).toBe("tcp")],
    [{ port: 9001 }, (c: ProcessCommand) => expect(flag(c.argv, "--port")).toBe("9001")],
    [{ max_model_len: 512 }, (c: ProcessCommand) => expect(flag(c.argv, "--max-model-len")).toBe("512")],
    [{ backend: "rngd" }, (c: ProcessCommand) => expect(flag(c.argv, "--backend")).toBe("rngd")],
    [{ args: ["--chip", "-1"] }, (c: ProcessCommand) => expect(c.argv.slice(-2)).toEqual(["--chip", "-1"])],
    [{ env: { POD_UID: "abc" } }, (c: ProcessCommand) => expect(c.env.POD_UID).toBe("abc")],
    [{ host: "127.0.0.1" }, (c: ProcessCommand) => expect(flag(c.argv, "--host")).toBe("127.0.0.1")],
  ] as [RunConfig, (c: ProcessCommand) => void][])("decode with %j", async (config, check) => {
    check(await dry({ kind: "decode", model: "/m" }, config));
  });

  test("replicas: lists of prefill/decode URLs reach the gateway, which balances over them; threads reach the workers", async () => {
    const { argv } = await dry({ kind: "serve" }, { prefill_url: ["http://p:1", "http://p:3"], decode_url: ["http://d:2", "http://d:4", "http://d:6"] });
    expect(flag(argv, "--prefill")).toBe("http://p:1,http://p:3");
    expect(flag(argv, "--decode")).toBe("http://d:2,http://d:4,http://d:6");
    expect(flag((await dry({ kind: "decode", model: "/m" }, { threads: 2 })).argv, "--threads")).toBe("2");
    expect(() => buildCommand({ kind: "serve" }, { threads: 2 })).toThrow(expect.objectContaining({ key: "threads" }));
    expect(() => buildCommand({ kind: "serve" }, { decode_url: [] })).toThrow(expect.objectContaining({ key: "decode_url" }));
  });

  test("prefill_url / decode_url reach the gateway", async () => {
    const { argv } = await dry({ kind: "serve" }, { prefill_url: "http://p:1", decode_url: "http://d:2" });
    expect(flag(argv, "--prefill")).toBe("http://p:1");
    expect(flag(argv, "--decode")).toBe("http://d:2");
  });
});

describe("rngd-pd run(): bad config names the key", () => {
  test.each([
    [{ kind: "decode" }, { colour: "red" }, "colour"],
    [{ kind: "decode" }, { port: 70000 }, "port"],
    [{ kind: "decode" }, { port: "8000" }, "port"],
    [{ kind: "decode" }, { max_model_len: 0 }, "max_model_len"],
    [{ kind: "decode" }, { seq_len: 512 }, "seq_len"],
    [{ kind: "decode" }, { backend: "gpu" }, "backend"],
    [{ kind: "prefill" }, { backend: "atom" }, "backend"],
    [{ kind: "serve" }, { backend: "rngd" }, "backend"],
    [{ kind: "serve" }, { prefill_url: "not a url" }, "prefill_url"],
    [{ kind: "decode" }, { metrics_port: 9400 }, "metrics_port"],
    [{ kind: "decode" }, { args: "--x" }, "args"],
    [{ kind: "decode" }, { env: { A: 1 } }, "env.A"],
    [{ kind: "train" }, {}, "kind"],
    [{ kind: "decode", batch_hint: 0 }, {}, "batch_hint"],
  ] as [Workload, RunConfig, string][])("%j %j -> %s", (w, c, key) => {
    let err: unknown;
    try {
      buildCommand(w, c);
    } catch (e) {
      err = e;
    }
    expect(isAirmError(err, "CONFIG")).toBe(true);
    expect((err as { key: string }).key).toBe(key);
    expect((err as Error).message.startsWith(`${key}:`)).toBe(true);
  });
});

test("run() without dry_run returns the started child process", async () => {
  const child = (await run({ kind: "decode", model: "/m" }, { args: ["--help"] })) as import("node:child_process").ChildProcess;
  expect(typeof child.pid).toBe("number");
  const code = await new Promise((r) => child.once("exit", r));
  expect(code).toBe(0);
});

describe("every argv built here parses with the part's own command line", () => {
  test.each([
    ["decode", { localPrefill: true, maxModelLen: 4096, batch: 8, threads: 2 }],
    ["prefill", {}],
    ["solo", { maxModelLen: 512 }],
  ] as const)("worker %s %j", async (role, o) => {
    const { WORKER_COMMAND } = await import("@airm/worker");
    const argv = workerArgv({ role, backend: role === "decode" ? "atom" : "rngd-full", host: "127.0.0.1", port: 0, ...o });
    const { values } = WORKER_COMMAND.parse(argv.slice(2));
    expect(values.role).toBe(role);
    expect(values.localPrefill).toBe("localPrefill" in o);
  });

  test.each([{ localPrefill: true }, { localPrefill: true, disaggregation: "auto" as const }, {}])("gateway %j", async (o) => {
    const { GATEWAY_COMMAND } = await import("@airm/gateway");
    const argv = gatewayArgv({ host: "127.0.0.1", port: 0, prefill: ["http://127.0.0.1:1"], decode: ["http://127.0.0.1:2"], ...o });
    expect(() => GATEWAY_COMMAND.parse(argv.slice(2))).not.toThrow();
  });
});
