// `airm up` as a user runs it: a real child process that starts real workers and a gateway on
// 127.0.0.1, serves a completion, and leaves nothing behind on SIGTERM.
import { execFileSync } from "node:child_process";
import { existsSync, mkdtempSync, realpathSync, rmSync, statSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { makeTinyModel } from "@airm/llama";
import { freePort, sweepStaleClusterDirs } from "../src/index.ts";
import { type AirmUp, startAirmUp, waitFor } from "./helpers/airm-up.ts";

const airm = fileURLToPath(new URL("../bin/airm.mjs", import.meta.url));
let dir: string;
let model: string;

/** Direct children of `pid` as [pid, command line]. */
function children(pid: number): [number, string][] {
  try {
    return execFileSync("ps", ["-o", "pid=,args=", "--ppid", String(pid)], { encoding: "utf8" })
      .split("\n")
      .map((l) => /^\s*(\d+)\s+(.*)$/.exec(l))
      .filter((m): m is RegExpExecArray => m !== null)
      .map((m) => [Number(m[1]), m[2]] as [number, string]);
  } catch {
    return [];
  }
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

function startUp(args: string[], env: Record<string, string> = {}): AirmUp {
  return startAirmUp(args, { AIRM_MODEL_CACHE: join(dir, "cache"), ...env });
}

type Up = AirmUp;

/** airm up on free ports with `modelPath`; `check` runs on it; airm up's output is printed if it fails, and its group is always killed. */
async function withUp(modelPath: string, check: (up: Up, port: number) => Promise<void>, extra: string[] = [], env: Record<string, string> = {}): Promise<void> {
  const [port, pp, dp] = [await freePort(), await freePort(), await freePort()];
  const up = startUp(["--model", modelPath, "--port", String(port), "--prefill-port", String(pp), "--decode-port", String(dp), "--quiet", ...extra], env);
  try {
    await check(up, port);
  } catch (e) {
    console.error(`airm up stdout:\n${up.out()}\nairm up stderr:\n${up.err()}`);
    throw e;
  } finally {
    up.kill();
  }
}

/** Waits until airm up says it is ready; returns the pids of its four parts (prefill, two decode workers, gateway). */
async function readyParts(up: Up): Promise<number[]> {
  await waitFor(() => up.out().includes("rngd-pd is up") || up.child.exitCode !== null, 150_000, "airm up to be ready");
  const all = children(up.child.pid!);
  const parts = all.filter(([, args]) => /airm-(worker|gateway)\.mjs/.test(args)).map(([pid]) => pid);
  expect(parts.length, JSON.stringify(all)).toBe(4);
  // Every part runs on the Node this test runs on (the pinned one).
  for (const pid of parts) expect(realpathSync(`/proc/${pid}/exe`)).toBe(realpathSync(process.execPath));
  return parts;
}

beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), "airm-up-"));
  model = join(dir, "tiny");
  makeTinyModel({ arch: "llama", out: model });
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe("airm up", () => {
  test("reaches healthy, serves a completion, and on SIGTERM leaves no process and no shm folder", () =>
    withUp(model, async (up, port) => {
      const parts = await readyParts(up);
      expect(up.out()).toContain(`http://127.0.0.1:${port}`);
      expect(up.out()).toContain("curl -s");
      // The effective configuration, printed at start.
      expect(up.err()).toMatch(
        /airm up: 1 prefill \(rngd-full, 2 threads each, prompts one at a time\) : 2 decode \(atom, 2 threads each, the second while the other workers are idle, batch up to 16/,
      );
      const models = (await (await fetch(`http://127.0.0.1:${port}/v1/models`)).json()) as { data: { id: string }[] };
      const modelId = models.data[0].id;
      expect(up.out()).toContain(`"model": "${modelId}"`);
      const r = await fetch(`http://127.0.0.1:${port}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ model: modelId, prompt: "Hello there", max_tokens: 8, temperature: 0 }),
      });
      const body = (await r.json()) as { choices: { text: string }[]; usage: { completion_tokens: number } };
      expect(r.status, JSON.stringify(body)).toBe(200);
      expect(typeof body.choices[0].text).toBe("string");
      expect(body.usage.completion_tokens).toBeGreaterThan(0);
      const kids = children(up.child.pid!).map(([pid]) => pid);
      expect(kids).toEqual(expect.arrayContaining(parts));
      const shm = `/dev/shm/airm-up-${up.child.pid}`;
      // the core board the workers share (4 bytes per worker once each has written its slot)
      const board = join(tmpdir(), `airm-cores-${up.child.pid}`);
      expect(statSync(board).size).toBe(12);
      up.child.kill("SIGTERM");
      expect(await up.exit).toBe(0);
      for (const pid of parts) expect(alive(pid), `part ${pid} still running`).toBe(false);
      // other children (tsx's esbuild service) end when airm up's pipes close, a moment later
      await waitFor(() => kids.every((pid) => !alive(pid)), 10_000, "airm up's other child processes to exit");
      expect(existsSync(shm)).toBe(false);
      expect(existsSync(board)).toBe(false);
    }));

  test("Ctrl-C while the parts start stops the ones started and removes the shm folder (exit 130)", () =>
    withUp(model, async (up) => {
      // The cluster's folder made and the parts spawned, none of them ready yet (a worker takes
      // a second or more to start Node, tsx and the model): Ctrl-C now.
      const shm = `/dev/shm/airm-up-${up.child.pid}`;
      const end = Date.now() + 60_000;
      while (!existsSync(shm) && up.child.exitCode === null && Date.now() < end) await new Promise((r) => setTimeout(r, 5));
      expect(existsSync(shm)).toBe(true);
      await new Promise((r) => setTimeout(r, 150));
      const kids = children(up.child.pid!).map(([pid]) => pid);
      expect(kids.length).toBeGreaterThan(0);
      expect(up.out()).not.toContain("rngd-pd is up");
      up.child.kill("SIGINT");
      expect(await up.exit).toBe(130);
      expect(up.err()).toContain("SIGINT while starting");
      await waitFor(() => kids.every((pid) => !alive(pid)), 10_000, "the parts started so far to exit");
      expect(existsSync(shm)).toBe(false);
    }));

  /** True while any process of process group `pgid` is alive. */
  const groupAlive = (pgid: number): boolean => {
    try {
      process.kill(-pgid, 0);
      return true;
    } catch {
      return false;
    }
  };

  // What a terminal's Ctrl-C, `kill -TERM -<pgid>`, `timeout`, a supervisor or a container
  // runtime does: the signal reaches airm up and every part at once. At each moment, everything
  // stops within a grace period and nothing is left: no process, no folder.
  for (const [sig, when] of [
    ["SIGTERM", "just started"],
    ["SIGINT", "parts starting"],
    ["SIGINT", "serving"],
    ["SIGTERM", "serving"],
  ] as const) {
    test(`${sig} to the whole process group (${when}) stops everything within 15 s and leaves no process and no folder`, () =>
      withUp(model, async (up) => {
        const pgid = up.child.pid!;
        const shm = `/dev/shm/airm-up-${pgid}`;
        if (when === "just started") await new Promise((r) => setTimeout(r, 300));
        if (when === "parts starting") {
          await waitFor(() => children(pgid).some(([, a]) => /airm-worker\.mjs/.test(a)) || up.child.exitCode !== null, 60_000, "the first part to be spawned");
          await new Promise((r) => setTimeout(r, 400));
          expect(up.out()).not.toContain("rngd-pd is up");
        }
        if (when === "serving") await readyParts(up);
        const t0 = Date.now();
        process.kill(-pgid, sig);
        // and once more to airm up alone, as a parent that forwards signals (pnpm exec) does
        await new Promise((r) => setTimeout(r, 30));
        try {
          process.kill(pgid, sig);
        } catch {
          // already gone
        }
        const code = await up.exit;
        await waitFor(() => !groupAlive(pgid), 15_000, "every process of the group to exit");
        expect(Date.now() - t0).toBeLessThan(15_000);
        // 0 or 130 from airm up; null when the signal came before it had its handlers (nothing started yet)
        expect([0, 130, null], up.err()).toContain(code);
        expect(up.err()).not.toMatch(/\n\s+at /); // no stack trace
        expect(existsSync(shm)).toBe(false);
      }));
  }

  test("if airm up itself is SIGKILLed, its parts notice and stop", () =>
    withUp(model, async (up) => {
      const parts = await readyParts(up);
      const shm = `/dev/shm/airm-up-${up.child.pid}`;
      up.child.kill("SIGKILL");
      await waitFor(() => parts.every((pid) => !alive(pid)), 20_000, "the orphaned parts to stop");
      await up.exit;
      // the killed airm up could not remove its folder; the next airm up sweeps it
      expect(existsSync(shm)).toBe(true);
      expect(sweepStaleClusterDirs("/dev/shm", "airm-up-")).toContain(shm);
      expect(existsSync(shm)).toBe(false);
    }));

  test("a transport plugin installed outside the workspace (AIRM_PLUGINS) gets the sidecar it declares, with no code change", async () => {
    const completion = async (port: number) => {
      const id = ((await (await fetch(`http://127.0.0.1:${port}/v1/models`)).json()) as { data: { id: string }[] }).data[0].id;
      const r = await fetch(`http://127.0.0.1:${port}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ model: id, prompt: "through a plugin of its own", max_tokens: 8, temperature: 0 }),
      });
      expect(r.status).toBe(200);
      return ((await r.json()) as { choices: { text: string }[] }).choices[0].text;
    };
    let viaShm = "";
    await withUp(model, async (up, port) => {
      await readyParts(up);
      viaShm = await completion(port);
    });
    const plugin = fileURLToPath(new URL("./fixtures/memo-transport", import.meta.url));
    await withUp(
      model,
      async (up, port) => {
        await readyParts(up);
        const m = /KV transport memo, memo-server on (\S+),/.exec(up.out());
        expect(m, up.out()).not.toBeNull();
        const sidecar = children(up.child.pid!).filter(([, args]) => args.includes("memo-transport/server.mjs"));
        expect(sidecar.length).toBe(1);
        expect(await completion(port)).toBe(viaShm);
        // the KV crossed the plugin's own sidecar, and was released there
        const stats = (await (await fetch(`http://${m![1]}/stats`)).json()) as { blobs: number; puts: number };
        expect(stats.puts).toBeGreaterThan(0);
        expect(stats.blobs).toBe(0);
      },
      ["--kv-transport", "memo", "--sidecar-port", "0"],
      { AIRM_PLUGINS: plugin },
    );
  });

  test("a part that dies is restarted while the other decode worker serves; one that keeps dying makes airm up give up and clean up", () =>
    withUp(
      model,
      async (up, port) => {
        await readyParts(up);
        const decodes = () => children(up.child.pid!).filter(([, a]) => /airm-worker\.mjs/.test(a) && a.includes("--role decode"));
        const complete = async () => {
          const r = await fetch(`http://127.0.0.1:${port}/v1/completions`, {
            method: "POST",
            headers: { "content-type": "application/json" },
            body: JSON.stringify({ prompt: "still here?", max_tokens: 4, temperature: 0 }),
          });
          return r.status;
        };
        const shm = `/dev/shm/airm-up-${up.child.pid}`;
        const [[keep], [victim]] = decodes();
        process.kill(victim, "SIGKILL");
        // at once: every request is answered, by the other decode worker or past the dead one
        const statuses: number[] = [];
        for (let i = 0; i < 6; i++) statuses.push(await complete());
        expect(statuses).toEqual([200, 200, 200, 200, 200, 200]);
        await waitFor(() => up.err().includes("airm up: decode-2 is healthy again"), 60_000, "the restarted decode worker");
        expect(up.err()).toMatch(/the decode-2 was killed by SIGKILL; restarting it in 500 ms/);
        const restarted = decodes().find(([pid]) => pid !== keep && pid !== victim);
        expect(restarted).toBeDefined();
        // the gateway routes to it again once its probe answers
        const seesAll = async () => {
          const h = (await (await fetch(`http://127.0.0.1:${port}/health`)).json()) as { roles: { endpoints: { healthy: boolean }[] }[] };
          return h.roles.every((r) => r.endpoints.every((e) => e.healthy));
        };
        for (let i = 0; i < 100 && !(await seesAll()); i++) await new Promise((r) => setTimeout(r, 100));
        expect(await seesAll()).toBe(true);
        expect(await complete()).toBe(200);
        // --max-restarts 1: its second death within the minute stops the cluster, which cleans up
        process.kill(restarted![0], "SIGKILL");
        expect(await up.exit).toBe(1);
        expect(up.err()).toMatch(/the decode-2 was killed by SIGKILL \(2 deaths within 60 s\); giving up and stopping the cluster/);
        expect(children(up.child.pid!).filter(([, a]) => /airm-(worker|gateway)\.mjs/.test(a))).toEqual([]);
        expect(existsSync(shm)).toBe(false);
      },
      ["--max-restarts", "1"],
    ));

  test("a worker that fails to start makes airm up exit non-zero with its reason", () =>
    withUp(join(dir, "no-such-model"), async (up) => {
      expect(await up.exit).toBe(1);
      expect(up.err()).toMatch(/the (prefill|decode)(-\d+)? (exited with code \d+|was killed)/);
      expect(up.err()).toContain("no-such-model");
    }));

  test("a port in use is refused up front, naming it", async () => {
    const busy = createServer().listen(0, "127.0.0.1");
    await new Promise((r) => busy.once("listening", r));
    const port = (busy.address() as { port: number }).port;
    try {
      const up = startUp(["--model", model, "--port", String(port), "--quiet"]);
      try {
        expect(await up.exit).toBe(1);
        expect(up.err()).toContain(`127.0.0.1:${port} is already in use`);
      } finally {
        up.kill();
      }
    } finally {
      busy.close();
    }
  });
});

test("airm --help and each subcommand's --help describe their options", () => {
  const help = (args: string[]) => execFileSync(process.execPath, [airm, ...args], { encoding: "utf8" });
  expect(help(["--help"])).toMatch(/up\s+start a whole PD cluster/);
  const up = help(["up", "--help"]);
  for (const opt of [
    "--model",
    "--kv-transport",
    "--port",
    "--decode-backend",
    "--max-model-len",
    "--block-size",
    "--kv-cache-memory",
    "--max-num-batched-tokens",
    "--max-num-seqs",
    "--metrics-port",
    "--prefill-replicas",
    "--decode-replicas",
    "--decode-batch",
    "--prefill-threads",
    "--decode-threads",
    "--decode-nice",
  ]) {
    expect(up).toContain(opt);
  }
  expect(help(["run", "--help"])).toContain("--batch-hint");
  expect(help(["--help"])).toMatch(/top\s+a live console of a running cluster/);
  const top = help(["top", "--help"]);
  for (const opt of ["--gateway", "--k8s", "--selector", "--interval", "--once", "--json", "AIRM_INTERNAL_TOKEN"]) expect(top).toContain(opt);
});
