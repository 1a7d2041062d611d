import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { isAirmError, openEngine, registry } from "@airm/rm-core";
import { loadCheckpoint, makeTinyModel } from "@airm/llama";
import { engineTokens, referenceTokens } from "@airm/engine-kit";
import { RNGD_BACKENDS, rngdEngine, rngdSpec } from "../src/index.ts";

const root = mkdtempSync(join(tmpdir(), "airm-rngd-"));
const modelDir = join(root, "model");
const noCards = join(root, "dev-empty");
const threeCards = join(root, "dev-rngd");
const STEPS = 10;
let prompt: number[];
let reference: number[];

function env(extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  return { AIRM_DEV_ROOT: noCards, AIRM_ARTIFACT_CACHE: join(root, "artifacts"), AIRM_ENGINE_LOG: "0", ...extra };
}

const generate = engineTokens;

beforeAll(async () => {
  makeTinyModel({ arch: "qwen2", out: modelDir, layers: 2, seed: 3 });
  const ckpt = await loadCheckpoint(modelDir);
  prompt = ckpt.tokenizer.encode("RNGD prefills this prompt, then decodes it");
  ckpt.tensors.close();
  reference = await referenceTokens(modelDir, prompt, STEPS);
  mkdirSync(noCards, { recursive: true });
  mkdirSync(join(threeCards, "rngd"), { recursive: true });
  for (const i of [0, 1, 3]) for (const n of ["mgmt", "pe0", "pe1", "pe0-1"]) writeFileSync(join(threeCards, "rngd", `npu${i}${n}`), "");
}, 120_000);
afterAll(() => rmSync(root, { recursive: true, force: true }));

describe("engine rngd", () => {
  it("declares in package.json the backends its code runs, each in every role", () => {
    registry.addHost(new URL("..", import.meta.url));
    const meta = registry.entry("airm.workloads", "rngd")!.meta.backends as Record<string, { roles: string[] }>;
    expect(Object.keys(meta).sort()).toEqual(Object.keys(rngdSpec.backends).sort());
    expect(Object.keys(meta).sort()).toEqual([...RNGD_BACKENDS].sort());
    for (const b of RNGD_BACKENDS) expect(meta[b].roles).toEqual(["prefill", "decode", "solo"]);
  });

  for (const backend of RNGD_BACKENDS) {
    it(`backend ${backend} generates the greedy tokens of @airm/llama solo`, async () => {
      const engine = await openEngine(rngdEngine, { model: modelDir, backend, chip: 0 }, { env: env() });
      try {
        expect(engine.backend).toBe(backend);
        // the context buckets an RNGD compiles up to the model's context (2048 for this tiny model)
        expect(engine.variants()).toEqual([512, 1024, 2048].flatMap((seqLen) => [1, 4, 8, 16].map((batch) => ({ batch, seqLen }))));
        expect(engine.pickVariant(prompt.length, STEPS)).toEqual({ batch: 1, seqLen: 512 });
        expect(await generate(engine, prompt, STEPS)).toEqual(reference);
      } finally {
        await engine.close();
      }
    });
  }

  it("runs on the CPU reference and never claims a card, even with cards visible", async () => {
    const engine = await openEngine(rngdEngine, { model: modelDir, chip: 2 }, { env: env({ AIRM_DEV_ROOT: threeCards }) });
    try {
      expect(engine.device).toMatchObject({ vendor: "cpu", path: "cpu-reference", device: null });
      expect(engine.device.detail).toContain("card npu3 (rngd:2) is visible but not driven");
      expect(engine.device.detail).toContain("no native RNGD runtime");
    } finally {
      await engine.close();
    }
  });

  it("--chip -1 resolves a uuid device-plugin id through furiosa-smi (fake libfuriosa_smi.so)", async () => {
    const smi = join(root, "libfuriosa_smi.so");
    const fixture = join(dirname(fileURLToPath(import.meta.url)), "fixtures", "fake-furiosa-smi.c");
    execFileSync("gcc", ["-shared", "-fPIC", "-O1", "-o", smi, fixture]);
    const ckpt = join(root, "kubelet_internal_checkpoint");
    writeFileSync(
      ckpt,
      JSON.stringify({
        Data: { PodDeviceEntries: [{ PodUID: "pod-1", ContainerName: "prefill", ResourceName: "furiosa.ai/rngd", DeviceIDs: { "0": ["FAKE-UUID-1"] } }], RegisteredDevices: {} },
        Checksum: 7,
      }),
    );
    const base = env({ AIRM_DEV_ROOT: threeCards, POD_UID: "pod-1", AIRM_KUBELET_CHECKPOINT: ckpt });
    await expect(openEngine(rngdEngine, { model: modelDir, chip: -1 }, { env: base })).rejects.toMatchObject({ code: "DEVICE", reason: "UNKNOWN_DEVICE_ID" });
    process.env.FAKE_FURIOSA_DEVICES = "0,1,3";
    try {
      const engine = await openEngine(rngdEngine, { model: modelDir, chip: -1 }, { env: { ...base, AIRM_FURIOSA_SMI_LIB: smi } });
      expect(engine.device.device).toBeNull();
      expect(engine.device.detail).toContain("--chip -1 -> npu1 (rngd:1)");
      expect(engine.device.detail).toContain("furiosa-smi");
      await engine.close();
    } finally {
      delete process.env.FAKE_FURIOSA_DEVICES;
    }
  });

  it("stops with typed errors for a bad backend, an ordinal past the cards, and an ambiguous --chip -1", async () => {
    await expect(openEngine(rngdEngine, { model: modelDir, backend: "atom" }, { env: env() })).rejects.toMatchObject({ code: "CONFIG" });
    await expect(openEngine(rngdEngine, { model: modelDir, chip: 3 }, { env: env({ AIRM_DEV_ROOT: threeCards }) })).rejects.toMatchObject({
      code: "DEVICE",
      reason: "NO_SUCH_ORDINAL",
    });
    await expect(openEngine(rngdEngine, { model: modelDir, chip: -1 }, { env: env({ AIRM_DEV_ROOT: threeCards }) })).rejects.toMatchObject({ code: "DEVICE", reason: "AMBIGUOUS" });
    await expect(openEngine(rngdEngine, { model: join(root, "nope") }, { env: env() })).rejects.toMatchObject({ code: "MODEL_LOAD" });
    await expect(openEngine(rngdEngine, { model: modelDir }, { env: env(), options: { threads: 3 } })).rejects.toMatchObject({ code: "CONFIG" });
  });

  it("serves up to --max-model-len (512 here) and refuses requests past it, stating both numbers", async () => {
    const engine = await openEngine(rngdEngine, { model: modelDir, maxModelLen: 512 }, { env: env() });
    try {
      // New requests run on the widest batch compiled at S; one stream picks the smallest that holds it.
      expect(engine.activeVariant).toEqual({ batch: 16, seqLen: 512 });
      expect(engine.pickVariant(400, 112)).toEqual({ batch: 1, seqLen: 512 });
      try {
        engine.pickVariant(400, 113);
        expect.unreachable();
      } catch (e) {
        expect(isAirmError(e, "CONTEXT_OVERFLOW")).toBe(true);
        expect((e as Error).message).toContain("prompt + max_tokens = 513 tokens exceeds max_model_len of 512 tokens");
      }
    } finally {
      await engine.close();
    }
  });
});
