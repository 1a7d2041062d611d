// The image built from the Dockerfile (scripts/image/build.sh), its entrypoints run as real
// containers (podman + runc) under the chart's security settings: read-only root, user 65532,
// every capability dropped, no new privileges, tmpfs where the chart has emptyDirs (/tmp,
// /cache), the model mounted read-only. Prefill and decode share a memory-backed volume for `shm`,
// as the chart's kv-shm emptyDir (medium: Memory). A completion through the gateway's container
// equals `airm up`'s on the host, over shm and over tcp (the relay in a container too); SIGTERM
// stops every container within its grace period and leaves nothing in the shared volume; a write
// to the root filesystem fails. Containers use the host's network, bound to 127.0.0.1.
// Needs root, podman, buildah, runc and mmdebstrap (.ci/run installs them); skipped otherwise.
// A signal that stops the test process removes its containers and volume (test/podman.ts);
// checked on the image's base with a process of its own (fixtures/podman-run.ts).
import { type ChildProcess, execFileSync, spawn, spawnSync } from "node:child_process";
import { chmodSync, mkdtempSync, readdirSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { makeTinyModel } from "../packages/llama/src/index.ts";
import { freePort } from "../packages/workload-runner/src/cluster-plan.ts";
import { killOnInterrupt, onInterrupt } from "../scripts/rig-cleanup.ts";
import { ended, leftovers, removeRun, type Run, show, startRun } from "./interrupt-helpers.ts";
import { until } from "./netns-helpers.ts";
import { PodmanRun, podman, podmanEnv } from "./podman.ts";

const repo = fileURLToPath(new URL("..", import.meta.url));
const has = (cmd: string) => spawnSync("sh", ["-c", `command -v ${cmd}`]).status === 0;
const why =
  process.getuid?.() !== 0
    ? "needs root"
    : ["podman", "buildah", "runc", "mmdebstrap"].find((c) => !has(c))
      ? "needs podman, buildah, runc and mmdebstrap (.ci/run installs them)"
      : null;
const tag = `airm-test-${process.pid}`;
/** The chart's security settings, as podman flags. */
const SECURE = [
  "--read-only",
  "--read-only-tmpfs=false",
  "--user",
  "65532:65532",
  "--cap-drop=ALL",
  "--security-opt",
  "no-new-privileges",
  "--tmpfs",
  "/tmp:rw,mode=1777",
  "--tmpfs",
  "/cache:rw,mode=1777",
];
const GRACE_S = 10;

async function healthy(url: string): Promise<boolean> {
  return fetch(`${url}/health`).then(
    async (r) => r.ok && ((await r.json()) as { status?: string }).status === "ok",
    () => false,
  );
}

async function complete(url: string, prompt: string): Promise<string> {
  const id = ((await (await fetch(`${url}/v1/models`)).json()) as { data: { id: string }[] }).data[0]!.id;
  const r = await fetch(`${url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: id, prompt, max_tokens: 16, temperature: 0 }),
  });
  const body = (await r.json()) as { choices: { text: string }[] };
  expect(r.status, JSON.stringify(body)).toBe(200);
  return body.choices[0]!.text;
}

const PROMPT = "The quick brown fox jumps over the lazy dog and";

describe.skipIf(why !== null)(`the image's containers${why ? ` (skipped: ${why})` : ""}`, () => {
  let image = "";
  let up: ChildProcess | undefined;
  let want = "";
  const model = mkdtempSync(join(tmpdir(), "airm-containers-model-"));
  const forgetModel = onInterrupt(() => rmSync(model, { recursive: true, force: true }));
  const made = new PodmanRun(tag);
  let volume = "";

  /** Starts one container of the image with the chart's settings; returns its name. */
  const run = (name: string, args: string[], extra: string[] = []): string => made.run(name, ["--network", "host", ...SECURE, "-v", `${model}:/model:ro`, ...extra], image, args);

  beforeAll(async () => {
    const t0 = Date.now();
    const out = execFileSync("bash", [join(repo, "scripts/image/build.sh")], { encoding: "utf8", env: podmanEnv, timeout: 900_000, stdio: ["ignore", "pipe", "pipe"] });
    image = out.trim().split("\n").pop()!;
    console.log(`image ${image} (build.sh ${((Date.now() - t0) / 1000).toFixed(1)} s), ${podman(["image", "inspect", "--format", "{{.Size}}", image]).trim()} bytes`);
    makeTinyModel({ arch: "llama", out: model, seed: 3 });
    // readable by the containers' user (65532)
    chmodSync(model, 0o755);
    for (const f of readdirSync(model)) chmodSync(join(model, f), statSync(join(model, f)).isDirectory() ? 0o755 : 0o644);
    // the reference: airm up on the host, with the same model
    const port = await freePort();
    up = killOnInterrupt(
      spawn(process.execPath, [join(repo, "packages/workload-runner/bin/airm.mjs"), "up", "--model", model, "--port", String(port), "--quiet"], {
        stdio: "ignore",
        env: { ...process.env, AIRM_LOG_LEVEL: "warn" },
      }),
    );
    await until("airm up is ready", () => healthy(`http://127.0.0.1:${port}`), 120);
    want = await complete(`http://127.0.0.1:${port}`, PROMPT);
    up.kill("SIGINT");
    volume = made.volume("kv-shm", ["--opt", "type=tmpfs", "--opt", "device=tmpfs", "--opt", "o=mode=1777"]);
  }, 1_000_000);

  afterAll(() => {
    if (up && up.exitCode === null) up.kill("SIGKILL");
    made.removeAll();
    rmSync(model, { recursive: true, force: true });
    forgetModel();
  });

  it("over shm: prefill and decode share a memory-backed volume; the gateway's answer equals airm up's; SIGTERM stops every container within the grace period and leaves nothing in the volume", async () => {
    const [pp, dp, gp] = [await freePort(), await freePort(), await freePort()];
    const shm = ["-v", `${volume}:/dev/shm/rngd_kv_cluster`, "-e", "PD_SHM_ROOT=/dev/shm/rngd_kv_cluster", "-e", "AIRM_KV_TRANSPORT=shm"];
    const t0 = Date.now();
    const prefill = run("shm-prefill", ["airm-worker", "--role", "prefill", "--backend", "rngd-full", "--model", "/model", "--host", "127.0.0.1", "--port", String(pp)], shm);
    const decode = run("shm-decode", ["airm-worker", "--role", "decode", "--backend", "atom", "--model", "/model", "--host", "127.0.0.1", "--port", String(dp)], shm);
    // a container that only holds the volume, to look into it after the workers are gone
    const observer = run("shm-observer", ["node", "-e", "setInterval(() => {}, 1 << 30)"], ["-v", `${volume}:/v`]);
    // the chart's memory limit of the gateway container (values.yaml gateway.resources.limits.memory: 1Gi)
    const gateway = run(
      "shm-gateway",
      ["airm-gateway", "--host", "127.0.0.1", "--port", String(gp), "--prefill", `http://127.0.0.1:${pp}`, "--decode", `http://127.0.0.1:${dp}`],
      ["--memory", "1g"],
    );
    await until("the gateway container is ready", () => healthy(`http://127.0.0.1:${gp}`), 120);
    console.log(`shm: four containers ready ${((Date.now() - t0) / 1000).toFixed(1)} s after the first podman run`);
    expect(await complete(`http://127.0.0.1:${gp}`, PROMPT)).toBe(want);
    // each container's memory in its cgroup after a request (the chart requests 2Gi per worker, 256Mi for the gateway, limits it to 1Gi)
    for (const c of [prefill, decode, gateway]) {
      const [usage, limit] = podman(["stats", "--no-stream", "--format", "{{.MemUsage}}", c]).trim().split(" / ");
      console.log(`${c}: memory ${usage} of ${limit}`);
    }
    const inVolume = () => podman(["exec", observer, "node", "-e", "console.log(JSON.stringify(require('fs').readdirSync('/v', { recursive: true })))"]).trim();
    for (const c of [gateway, decode, prefill]) {
      const s0 = Date.now();
      podman(["stop", "--time", String(GRACE_S), c]);
      const state = JSON.parse(podman(["inspect", "--format", "{{json .State}}", c])) as { ExitCode: number };
      console.log(`${c}: stopped in ${Date.now() - s0} ms, exit code ${state.ExitCode}`);
      expect(Date.now() - s0).toBeLessThan(GRACE_S * 1000);
      expect(state.ExitCode).toBe(0);
    }
    // the workers removed their own folders: nothing of theirs is left in the shared memory
    expect(inVolume()).toBe("[]");
  }, 300_000);

  it("over tcp: the relay in a container too; the gateway's answer equals airm up's", async () => {
    const [rp, pp, dp, gp] = [await freePort(), await freePort(), await freePort(), await freePort()];
    const tcp = ["-e", "AIRM_KV_TRANSPORT=tcp", "-e", `AIRM_KV_TCP_ADDR=127.0.0.1:${rp}`];
    run("tcp-relay", ["airm-kv-relay", "--listen", `127.0.0.1:${rp}`]);
    run("tcp-prefill", ["airm-worker", "--role", "prefill", "--backend", "rngd-full", "--model", "/model", "--host", "127.0.0.1", "--port", String(pp)], tcp);
    run("tcp-decode", ["airm-worker", "--role", "decode", "--backend", "atom", "--model", "/model", "--host", "127.0.0.1", "--port", String(dp)], tcp);
    run("tcp-gateway", ["airm-gateway", "--host", "127.0.0.1", "--port", String(gp), "--prefill", `http://127.0.0.1:${pp}`, "--decode", `http://127.0.0.1:${dp}`]);
    await until("the gateway container is ready", () => healthy(`http://127.0.0.1:${gp}`), 120);
    expect(await complete(`http://127.0.0.1:${gp}`, PROMPT)).toBe(want);
  }, 300_000);

  it("the root filesystem is read-only and the user is 65532 without capabilities", () => {
    const c = run("probe", ["node", "-e", "setInterval(() => {}, 1 << 30)"]);
    const write = podman(["exec", c, "node", "-e", "require('fs').writeFileSync('/app/x', '1')"], { allowFail: true });
    expect(write).toMatch(/EROFS|read-only file system/i);
    const status = podman(["exec", c, "node", "-e", "console.log(require('fs').readFileSync('/proc/self/status', 'utf8'))"]);
    expect(status).toMatch(/^Uid:\s+65532\s/m);
    expect(status).toMatch(/^CapEff:\s+0+$/m);
    // /tmp (the chart's emptyDir) is writable
    podman(["exec", c, "node", "-e", "require('fs').writeFileSync('/tmp/x', '1')"]);
  }, 120_000);
});

/** The image's base (scripts/image/build.sh makes it once): it has node, and does not change with the sources. */
const baseImage = () => (has("podman") ? podman(["images", "--format", "{{.Repository}}:{{.Tag}}", "localhost/rngd-pd-base"]).trim().split("\n")[0] : "");
const whyNotBase =
  process.getuid?.() !== 0 ? "needs root" : !has("podman") || !has("runc") ? "needs podman and runc" : !baseImage() ? "needs the image's base (scripts/image/build.sh)" : null;
const exists = (kind: "container" | "volume", name: string) => spawnSync("podman", [kind, "exists", name], { env: podmanEnv }).status === 0;

describe.skipIf(whyNotBase !== null)(`containers of a process stopped by SIGTERM${whyNotBase ? ` (skipped: ${whyNotBase})` : ""}`, () => {
  it("are removed, with their volume, and no process of theirs is left", async () => {
    const marker = `airm-podman-interrupt-${process.pid}`;
    let run: Run | undefined;
    let made: { container: string; volume: string } | undefined;
    try {
      run = startRun(process.execPath, ["--import", "tsx", join(repo, "test", "fixtures", "podman-run.ts"), marker, baseImage()]);
      await until("the container runs", () => run!.out().includes("\n") || run!.proc.exitCode !== null, 120);
      made = JSON.parse(run.out()) as { container: string; volume: string };
      expect([exists("container", made.container), exists("volume", made.volume)]).toEqual([true, true]);
      // conmon and the container's process name the marker
      expect(leftovers({ markers: [marker] }).length).toBeGreaterThanOrEqual(2);
      run.proc.kill("SIGTERM");
      expect(await ended(run, 60_000)).toEqual({ code: null, signal: "SIGTERM" });
      expect([exists("container", made.container), exists("volume", made.volume)]).toEqual([false, false]);
      expect(show(leftovers({ markers: [marker] }))).toEqual([]);
    } finally {
      removeRun(run, { markers: [marker] }, []);
      if (made) podman(["rm", "-f", "-t", "0", made.container], { allowFail: true });
      if (made) podman(["volume", "rm", "-f", made.volume], { allowFail: true });
    }
  }, 120_000);
});
