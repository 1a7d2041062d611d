// The core board: parts of one host say in a shared file whether they have work; an engine with
// two kernel threads and secondThread when-idle runs the second only while every other part is
// idle, and gives the same tokens either way.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { isAirmError } from "@airm/rm-core";
import { makeTinyModel } from "@airm/llama";
import { CoreBoard, CpuBackedEngine, parseCoreBoard, type CpuEngineSpec } from "../src/index.ts";
import { testEngineSpec } from "./engine-spec.ts";

const root = mkdtempSync(join(tmpdir(), "airm-cores-test-"));
const modelDir = join(root, "model");
const boardPath = join(root, "cores");
const PROMPT = [5, 17, 3, 99, 42, 7, 8, 120, 64, 33, 2, 11];

beforeAll(() => {
  makeTinyModel({ arch: "llama", out: modelDir, seed: 3 });
});
afterAll(() => rmSync(root, { recursive: true, force: true }));

const spec = (over: Partial<CpuEngineSpec> = {}): CpuEngineSpec => testEngineSpec({ threads: 2, maxModelLen: 64, ...over });

/** Greedy tokens of PROMPT and 6 decode steps, and how many of the passes used the second thread. */
async function run(engine: CpuBackedEngine): Promise<{ tokens: number[]; secondThread: number; passes: number }> {
  const first = await engine.prefill(PROMPT, { keepStream: true });
  const stream = first.stream!;
  const tokens = [first.firstToken];
  for (let i = 0; i < 6; i++) {
    const [r] = await engine.decode([{ stream, token: tokens[tokens.length - 1]! }]);
    if (r!.error !== undefined) throw r!.error;
    tokens.push(r!.token);
  }
  engine.release(stream);
  const c = engine.passCounts();
  return { tokens, secondThread: c.secondThread, passes: c.passes };
}

describe("core board", () => {
  it("parts see each other's work through the file, and a closed part reads idle", () => {
    const a = CoreBoard.open({ path: join(root, "pair"), slot: 0 });
    const b = CoreBoard.open({ path: join(root, "pair"), slot: 3 });
    expect(a.othersBusy()).toBe(false);
    b.publish(true);
    expect(a.othersBusy()).toBe(true);
    expect(b.othersBusy()).toBe(false); // its own slot does not count
    a.publish(true);
    expect(b.othersBusy()).toBe(true);
    b.publish(false);
    expect(a.othersBusy()).toBe(false);
    a.close();
    expect(b.othersBusy()).toBe(false);
    b.close();
  });

  it("refuses a malformed spec or a file it cannot make, naming the setting", () => {
    for (const bad of ["no-slot", "/tmp/x:", "/tmp/x:-1", "/tmp/x:64"]) {
      let err: unknown;
      try {
        parseCoreBoard(bad);
      } catch (e) {
        err = e;
      }
      expect(isAirmError(err) && err.code === "CONFIG").toBe(true);
      expect(String(err)).toMatch(/coreBoard/);
    }
    expect(() => CoreBoard.open({ path: join(root, "missing-dir", "cores"), slot: 0 })).toThrow(/cannot open the core board/);
  });

  it("when-idle: the second thread runs only while the other parts are idle, with the same tokens", async () => {
    const other = CoreBoard.open({ path: boardPath, slot: 1 });
    let alone: Awaited<ReturnType<typeof run>>;
    const engine = await CpuBackedEngine.open(modelDir, spec({ secondThread: "when-idle", coreBoard: { path: boardPath, slot: 0 } }));
    try {
      alone = await run(engine);
      expect(alone.secondThread).toBe(alone.passes);
      // while it has a stream, the others see it busy; once released, idle
      const held = await engine.prefill(PROMPT, { keepStream: true });
      expect(other.othersBusy()).toBe(true);
      engine.release(held.stream!);
      expect(other.othersBusy()).toBe(false);

      other.publish(true);
      const before = engine.passCounts();
      const shared = await run(engine);
      expect(shared.secondThread).toBe(before.secondThread);
      expect(shared.passes).toBeGreaterThan(before.passes);
      expect(shared.tokens).toEqual(alone.tokens);
    } finally {
      await engine.close();
      other.close();
    }
    const one = await CpuBackedEngine.open(modelDir, spec({ threads: 1 }));
    try {
      const single = await run(one);
      expect(single.tokens).toEqual(alone.tokens);
      expect(single.secondThread).toBe(0);
    } finally {
      await one.close();
    }
  });
});
