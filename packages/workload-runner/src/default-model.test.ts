import { createHash } from "node:crypto";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { DEFAULT_MODELS, chooseDefaultModel, resolveModelArg } from "./default-model.ts";

const dirs: string[] = [];
afterEach(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

/** A model cache folder holding `names` as cached files (small stand-ins with their manifests). */
function cacheWith(names: string[]): string {
  const dir = mkdtempSync(join(tmpdir(), "airm-default-model-"));
  dirs.push(dir);
  for (const name of names) {
    const bytes = Buffer.from(`stand-in for ${name}`);
    mkdirSync(join(dir, name));
    writeFileSync(join(dir, name, "model.gguf"), bytes);
    const sha256 = createHash("sha256").update(bytes).digest("hex");
    writeFileSync(join(dir, name, "manifest.json"), JSON.stringify({ name, file: "model.gguf", sha256, size: bytes.length, source: "test" }));
  }
  return dir;
}

describe("the model airm up serves", () => {
  it("without --model: the first pulled of the default list, in its order", async () => {
    const both = cacheWith([...DEFAULT_MODELS]);
    expect((await chooseDefaultModel({ AIRM_MODEL_CACHE: both })).path).toBe(join(both, DEFAULT_MODELS[0], "model.gguf"));
    const second = cacheWith([DEFAULT_MODELS[1]]);
    const chosen = await chooseDefaultModel({ AIRM_MODEL_CACHE: second });
    expect(chosen).toMatchObject({ kind: "real", path: join(second, DEFAULT_MODELS[1], "model.gguf") });
  });

  it("--model NAME is the pulled file; a known name not pulled says how to pull it; anything else is a path", async () => {
    const cache = cacheWith(["qwen2.5-coder-1.5b-instruct"]);
    const env = { AIRM_MODEL_CACHE: cache };
    expect((await resolveModelArg("qwen2.5-coder-1.5b-instruct", env)).path).toBe(join(cache, "qwen2.5-coder-1.5b-instruct", "model.gguf"));
    await expect(resolveModelArg("gemma-3-270m", env)).rejects.toThrow(/gemma-3-270m is not in the model cache; run "airm model pull gemma-3-270m"/);
    expect((await resolveModelArg("/models/some.gguf", env)).path).toBe("/models/some.gguf");
  });
});
