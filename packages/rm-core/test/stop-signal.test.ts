// untilStopSignal in real child processes: a signal, or the supervisor named by AIRM_PARENT_PID
// no longer being the parent.
import { spawn } from "node:child_process";
import { createRequire } from "node:module";
import { fileURLToPath, pathToFileURL } from "node:url";
import { expect, test } from "vitest";

const tsx = pathToFileURL(createRequire(import.meta.url).resolve("tsx")).href;
const src = fileURLToPath(new URL("../src/stop-signal.ts", import.meta.url));
const script = `const { untilStopSignal } = await import(${JSON.stringify(src)}); const keepAlive = setInterval(() => {}, 1000); const stop = untilStopSignal(process.env, 50); console.log("waiting"); console.log(await stop); clearInterval(keepAlive);`;

function run(env: NodeJS.ProcessEnv) {
  const child = spawn(process.execPath, ["--import", tsx, "--input-type=module", "-e", script], { env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "inherit"] });
  let out = "";
  child.stdout!.on("data", (d) => (out += d));
  const exited = new Promise<number | null>((r) => child.once("exit", (code) => r(code)));
  const waiting = new Promise<void>((r) => child.stdout!.on("data", () => out.includes("waiting") && r()));
  return { child, exited, waiting, out: () => out.trim().split("\n").pop() };
}

test("SIGTERM ends the wait with its name", async () => {
  const p = run({ AIRM_PARENT_PID: "" });
  await p.waiting;
  p.child.kill("SIGTERM");
  expect(await p.exited).toBe(0);
  expect(p.out()).toBe("SIGTERM");
});

test("a supervisor that is no longer the parent ends the wait", async () => {
  // this test process is the child's parent, so a different pid means "the supervisor is gone"
  const p = run({ AIRM_PARENT_PID: String(process.pid + 1_000_000) });
  expect(await p.exited).toBe(0);
  expect(p.out()).toBe("parent exited");
});

test("while the named parent lives, the wait goes on", async () => {
  const p = run({ AIRM_PARENT_PID: String(process.pid) });
  await p.waiting;
  await new Promise((r) => setTimeout(r, 400));
  expect(p.child.exitCode).toBeNull();
  p.child.kill("SIGINT");
  await p.exited;
  expect(p.out()).toBe("SIGINT");
});
