// `airm up --topology FILE` as a user runs it: the real CLI places the gateway, the prefill and
// decode workers and the KV relay each on a host of a rig of network namespaces (links shaped to
// 1 Gbit/s), KV over tcp; a completion through 127.0.0.1:<port> equals a solo worker's (greedy),
// each part listens on its host's address, and SIGINT leaves no holder, agent or part behind.
// The fast half: strict checks of the file, and shm refused across hosts before anything starts.
// The rig half needs root (CI runs as root); skipped with the reason otherwise.
import { type ChildProcess, execFileSync, spawn, spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { makeTinyModel } from "../packages/llama/src/index.ts";
import { freePort } from "../packages/workload-runner/src/cluster-plan.ts";
import { checkTopology, TopologyError } from "../packages/workload-runner/src/topology.ts";
import { killOnInterrupt } from "../scripts/rig-cleanup.ts";
import { QUIET, SoloReference, until } from "./netns-helpers.ts";

const why = process.getuid?.() !== 0 ? "needs root (CAP_NET_ADMIN)" : ["/usr/sbin/ip", "/usr/sbin/tc"].some((p) => !existsSync(p)) ? "needs iproute2 (ip, tc)" : null;
const airm = fileURLToPath(new URL("../packages/workload-runner/bin/airm.mjs", import.meta.url));
const example = fileURLToPath(new URL("../examples/topology-4-hosts.yaml", import.meta.url));
const HOSTS = ["gateway-node", "prefill-node", "decode-node", "relay-node"];
const dir = mkdtempSync(join(tmpdir(), "airm-up-topology-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const place = { gateway: "gateway-node", prefill: "prefill-node", decode: "decode-node", relay: "relay-node" };
const topo = (o: Record<string, unknown> = {}) => ({ hosts: HOSTS, link: { rate: "1gbit" }, place, ...o });
const field = (raw: unknown): string => {
  try {
    checkTopology(raw);
    return "accepted";
  } catch (e) {
    expect(e).toBeInstanceOf(TopologyError);
    return (e as Error).message;
  }
};

describe("airm up --topology: the file is checked strictly", () => {
  it("accepts the example and names the field of each mistake", () => {
    expect(field(topo())).toBe("accepted");
    expect(field({ ...topo(), extra: 1 })).toMatch(/^topology\.extra: unknown field/);
    expect(field(topo({ place: { ...place, decode: "nowhere" } }))).toBe(
      'topology.place.decode: no host "nowhere" in topology.hosts (gateway-node, prefill-node, decode-node, relay-node)',
    );
    expect(field(topo({ place: { ...place, prefill: ["prefill-node", "nope"] } }))).toMatch(/^topology\.place\.prefill\[1\]: no host "nope"/);
    expect(field(topo({ place: { gateway: "gateway-node", decode: "decode-node" } }))).toMatch(/^topology\.place\.prefill: missing/);
    expect(field(topo({ place: { ...place, gateway: ["gateway-node", "relay-node"] } }))).toMatch(/^topology\.place\.gateway: one host only/);
    expect(field(topo({ place: { ...place, relay: ["relay-node", "decode-node"] } }))).toMatch(/^topology\.place\.relay: one host only/);
    expect(field(topo({ place: { ...place, epp: "relay-node" } }))).toMatch(/^topology\.place\.epp: unknown field/);
    expect(field(topo({ place: undefined }))).toMatch(/^topology\.place: missing/);
    expect(field(topo({ hosts: ["a", "a"] }))).toMatch(/^topology\.hosts\[1\]\.name: a twice/);
    expect(field(topo({ hosts: [{ name: "gateway-node", speed: "1gbit" }] }))).toMatch(/^topology\.hosts\[0\]\.speed: unknown field/);
    expect(field(topo({ link: { rate: "fast" } }))).toMatch(/rate must be like 1gbit/);
  });

  it("refuses shm across hosts before starting anything, and a relay that is not placed", () => {
    const run = (args: string[]) => spawnSync(process.execPath, [airm, "up", "--model", join(dir, "none"), ...args], { encoding: "utf8", timeout: 60_000 });
    const shm = run(["--topology", example, "--kv-transport", "shm"]);
    expect(shm.status).toBe(1);
    expect(shm.stderr).toMatch(/topology\.place: shm needs one \/dev\/shm: put prefill and decode on one host, or use .*tcp/);
    expect(shm.stderr).not.toMatch(/rig|healthy/);
    const noRelay = join(dir, "no-relay.json");
    writeFileSync(noRelay, JSON.stringify(topo({ place: { gateway: "gateway-node", prefill: "prefill-node", decode: "decode-node" } })));
    const tcp = run(["--topology", noRelay, "--kv-transport", "tcp"]);
    expect(tcp.status).toBe(1);
    expect(tcp.stderr).toMatch(/topology\.place\.relay: missing: the tcp transport runs the kv-relay/);
  });
});

/** Pids and command lines of the processes whose parent is `pid`. */
function children(pid: number): { pid: number; args: string }[] {
  const out = spawnSync("ps", ["-o", "pid=,args=", "--ppid", String(pid)], { encoding: "utf8" }).stdout ?? "";
  return out
    .split("\n")
    .map((l) => /^\s*(\d+)\s+(.*)$/.exec(l))
    .filter((m): m is RegExpExecArray => m !== null)
    .map((m) => ({ pid: Number(m[1]), args: m[2] }));
}
const alive = (pid: number) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};
const complete = async (port: number, prompt: string) => {
  const r = await fetch(`http://127.0.0.1:${port}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: "tiny", prompt, max_tokens: 16, temperature: 0, seed: 1 }),
  });
  expect(r.status, await r.clone().text()).toBe(200);
  return ((await r.json()) as { choices: { text: string }[] }).choices[0].text;
};

describe.skipIf(why !== null)(`airm up --topology on four hosts${why ? ` (skipped: ${why})` : ""}`, () => {
  const model = join(dir, "tiny");
  let up: ChildProcess;
  let out = "";
  let err = "";
  let port = 0;
  const solo = new SoloReference();

  beforeAll(async () => {
    makeTinyModel({ arch: "llama", out: model });
    port = await freePort();
    const env = { ...process.env, ...QUIET };
    // airm up and its parts (its process tree) are killed if a signal stops the test; its rig dies with it
    up = killOnInterrupt(
      spawn(process.execPath, [airm, "up", "--topology", example, "--kv-transport", "tcp", "--model", model, "--decode-replicas", "1", "--port", String(port), "--quiet"], {
        env,
        stdio: ["ignore", "pipe", "pipe"],
        detached: true,
      }),
    );
    up.stdout!.on("data", (d) => (out += d));
    up.stderr!.on("data", (d) => (err += d));
    try {
      await until("airm up --topology is up", () => out.includes("rngd-pd is up") || up.exitCode !== null, 150);
      expect(up.exitCode, err).toBeNull();
      // the reference: a solo worker and its gateway on this host's loopback, outside the rig
      await solo.start(model);
    } catch (e) {
      console.error(`airm up stdout:\n${out}\nstderr:\n${err}`);
      throw e;
    }
  }, 300_000);

  afterAll(() => {
    solo.stop();
    try {
      process.kill(-up.pid!, "SIGKILL");
    } catch {
      // already gone
    }
  });

  it("serves through 127.0.0.1 what a solo worker answers, each part on its host's address, and SIGINT leaves nothing", { timeout: 120_000 }, async () => {
    for (const prompt of ["The capital of France is", "one two three four"])
      expect(await complete(port, prompt)).toBe(await solo.text({ prompt, max_tokens: 16, temperature: 0, seed: 1 }));
    expect(out).toMatch(/kv-relay\s+on relay-node\s+10\.77\.0\.4:7400/);

    // each host's TCP listeners (ss inside its namespace) are on its own address only
    const kids = children(up.pid!);
    const holders = kids.filter((k) => k.args === "sleep infinity").map((k) => k.pid);
    expect(holders.length).toBe(HOSTS.length + 1); // and the switch
    const listeners = new Map<string, string[]>();
    for (const h of holders) {
      const addr = /inet (10\.77\.0\.\d+)\//.exec(execFileSync("nsenter", ["-t", String(h), "-n", "ip", "-4", "addr", "show"], { encoding: "utf8" }))?.[1];
      if (!addr) continue; // the switch
      const ss = execFileSync("nsenter", ["-t", String(h), "-n", "ss", "-ltnH"], { encoding: "utf8" });
      listeners.set(
        addr,
        ss
          .split("\n")
          .filter(Boolean)
          .map((l) => l.trim().split(/\s+/)[3]),
      );
    }
    expect(Object.fromEntries(listeners)).toEqual({
      "10.77.0.1": [`10.77.0.1:${port}`],
      "10.77.0.2": ["10.77.0.2:8101"],
      "10.77.0.3": ["10.77.0.3:8102"],
      "10.77.0.4": ["10.77.0.4:7400"],
    });
    const parts = kids.filter((k) => /airm-(worker|gateway|kv-relay)\.mjs/.test(k.args)).map((k) => k.pid);
    expect(parts.length).toBe(4);
    const agents = kids.filter((k) => k.args.includes("node:net")).map((k) => k.pid);
    expect(agents.length).toBe(HOSTS.length);

    const t0 = Date.now();
    up.kill("SIGINT");
    const code = await new Promise<number | null>((r) => (up.exitCode !== null ? r(up.exitCode) : up.once("exit", (c) => r(c))));
    expect(code, err).toBe(0);
    expect(err).toMatch(/the rig is down/);
    const left = [...holders, ...parts, ...agents].filter(alive);
    expect(left, `left behind: ${left.join(", ")}`).toEqual([]);
    // (only this cluster's: another rig may be running on the machine)
    expect(children(process.pid).filter((k) => /sleep infinity|unshare/.test(k.args))).toEqual([]);
    expect(
      await fetch(`http://127.0.0.1:${port}/health`).then(
        () => "answered",
        () => "refused",
      ),
    ).toBe("refused");
    console.log(`airm up --topology stopped in ${Date.now() - t0} ms`);
  });
});
