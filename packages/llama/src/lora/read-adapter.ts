// Reads a LoRA adapter for a model config: a PEFT folder (adapter_config.json +
// adapter_model.safetensors) here, a llama.cpp GGUF file through gguf-adapter.ts. For a folder: the
// config checked (adapter-config.ts), the base model's name checked, every tensor named, mapped to
// a layer and projection and checked against the model's shapes, and the A/B matrices read as f32
// (exact for F32, BF16 and F16). Throws LoraError naming the key or the tensor. Knows files and
// PEFT's names, not the kernels.
import { closeSync, existsSync, openSync, readFileSync, statSync } from "node:fs";
import { basename, join } from "node:path";
import type { ModelConfig } from "../checkpoint-types.ts";
import { readExactly, readSafetensorsHeader, type SafetensorsHeader } from "../checkpoint/safetensors-source.ts";
import { type LoraAdapterConfig, parseAdapterConfig, targetedModules } from "./adapter-config.ts";
import { asLoraError, fingerprintOf, type LoraAdapterData, type LoraDtype, type LoraModuleWeights, toF32 } from "./adapter-data.ts";
import { isGgufAdapterPath, readGgufLoraAdapter } from "./gguf-adapter.ts";
import { LoraError } from "./lora-error.ts";
import { loraTensorName, parseLoraTensorName, projectionShape } from "./projections.ts";

export type { LoraAdapterData, LoraModuleWeights } from "./adapter-data.ts";

export const ADAPTER_CONFIG = "adapter_config.json";
export const ADAPTER_WEIGHTS = "adapter_model.safetensors";

export interface ReadAdapterOptions {
  /** The largest rank accepted (a larger `r` is refused naming `r`). */
  maxRank: number;
  /**
   * Names the base model goes by (its folder, its hub id, ...): `base_model_name_or_path` must equal
   * one of them or end in the same last path segment. Empty: not checked.
   */
  baseModelNames: string[];
}

/** The adapter's config file, parsed and checked. */
function readConfig(folder: string, model: ModelConfig, maxRank: number): LoraAdapterConfig {
  const file = join(folder, ADAPTER_CONFIG);
  if (!existsSync(file)) throw new LoraError(folder, `no ${ADAPTER_CONFIG}: a LoRA adapter is a PEFT folder (${ADAPTER_CONFIG} + ${ADAPTER_WEIGHTS})`);
  let json: unknown;
  try {
    json = JSON.parse(readFileSync(file, "utf8"));
  } catch (cause) {
    throw new LoraError(file, "is not valid JSON", { cause });
  }
  return parseAdapterConfig(json, file, model, maxRank);
}

/** Refuses an adapter trained on another base model (by `base_model_name_or_path`), naming the field. */
function checkBaseModel(cfg: LoraAdapterConfig, names: string[], file: string): void {
  if (cfg.baseModel === null || names.length === 0) return;
  const last = (p: string) => basename(p.replace(/[\\/]+$/, ""));
  const want = cfg.baseModel;
  if (names.some((n) => n === want || last(n) === last(want))) return;
  throw new LoraError(file, `base_model_name_or_path: the adapter was trained on ${JSON.stringify(want)}, this model is ${names.map((n) => JSON.stringify(n)).join(" / ")}`, {
    field: "base_model_name_or_path",
  });
}

/** A safetensors tensor's values as f32 (F32 as stored, BF16 and F16 widened exactly). */
function readF32(fd: number, file: string, t: SafetensorsHeader["tensors"][number]): Float32Array {
  const bytes = new Uint8Array(t.byteLength);
  try {
    readExactly(fd, file, bytes, t.start, `the end of tensor "${t.name}"`);
  } catch (e) {
    throw asLoraError(e, file, t.name);
  }
  return toF32(
    bytes,
    t.dtype as LoraDtype,
    t.shape.reduce((x, y) => x * y, 1),
    file,
    t.name,
  );
}

/** The header's tensors by name, each a LoRA weight of a targeted module of this model; refuses any other, naming it. */
function indexTensors(header: SafetensorsHeader, wanted: Set<string>, file: string, model: ModelConfig): Map<string, SafetensorsHeader["tensors"][number]> {
  const byName = new Map<string, SafetensorsHeader["tensors"][number]>();
  for (const t of header.tensors) {
    const parsed = parseLoraTensorName(t.name);
    if (!parsed) throw new LoraError(file, `tensor "${t.name}" is not a LoRA A/B weight of a q/k/v/o/gate/up/down projection of model.layers`, { tensor: t.name });
    if (parsed.layer >= model.numLayers)
      throw new LoraError(file, `tensor "${t.name}": layer ${parsed.layer} does not exist, the model has ${model.numLayers} layers`, { tensor: t.name });
    if (!wanted.has(t.name)) throw new LoraError(file, `tensor "${t.name}" is of a module that target_modules / layers_to_transform do not target`, { tensor: t.name });
    if (t.dtype !== "F32" && t.dtype !== "BF16" && t.dtype !== "F16")
      throw new LoraError(file, `tensor "${t.name}" has dtype ${t.dtype}; supported are F32, BF16 and F16`, { tensor: t.name });
    byName.set(t.name, t);
  }
  return byName;
}

/** The tensor `name`, present and of shape `shape`; LoraError naming it otherwise. */
function expectTensor(byName: Map<string, SafetensorsHeader["tensors"][number]>, name: string, shape: number[], file: string): SafetensorsHeader["tensors"][number] {
  const t = byName.get(name);
  if (!t) throw new LoraError(file, `tensor "${name}" is missing (target_modules says this module is adapted)`, { tensor: name });
  if (t.shape.length !== shape.length || t.shape.some((d, i) => d !== shape[i])) {
    throw new LoraError(file, `tensor "${name}" has shape [${t.shape.join(", ")}], this model and r need [${shape.join(", ")}]`, { tensor: name });
  }
  return t;
}

/** Every targeted module's A and B, read from the open weights file. */
function readModules(fd: number, file: string, cfg: LoraAdapterConfig, model: ModelConfig, configFile: string): LoraModuleWeights[] {
  const mods = targetedModules(cfg, model, configFile);
  let header: SafetensorsHeader;
  try {
    header = readSafetensorsHeader(fd, file);
  } catch (e) {
    throw asLoraError(e, file);
  }
  const wanted = new Set(mods.flatMap((m) => [loraTensorName(m.layer, m.proj, "A"), loraTensorName(m.layer, m.proj, "B")]));
  const byName = indexTensors(header, wanted, file, model);
  return mods.map(({ layer, proj }) => {
    const shape = projectionShape(model, proj);
    const a = expectTensor(byName, loraTensorName(layer, proj, "A"), [cfg.r, shape.in], file);
    const b = expectTensor(byName, loraTensorName(layer, proj, "B"), [shape.out, cfg.r], file);
    return { layer, proj, a: readF32(fd, file, a), b: readF32(fd, file, b) };
  });
}

/** Reads and checks the PEFT folder `folder` (see readLoraAdapter). */
function readPeftAdapter(folder: string, model: ModelConfig, opts: ReadAdapterOptions): LoraAdapterData {
  const config = readConfig(folder, model, opts.maxRank);
  const configFile = join(folder, ADAPTER_CONFIG);
  checkBaseModel(config, opts.baseModelNames, configFile);
  const file = join(folder, ADAPTER_WEIGHTS);
  if (!existsSync(file)) {
    const bin = existsSync(join(folder, "adapter_model.bin")) ? " (adapter_model.bin, a pickle, is not read: save the adapter with safe_serialization)" : "";
    throw new LoraError(folder, `no ${ADAPTER_WEIGHTS}${bin}`);
  }
  const fd = openSync(file, "r");
  try {
    const modules = readModules(fd, file, config, model, configFile);
    return { folder, config, modules, fingerprint: fingerprintOf(config, modules) };
  } finally {
    closeSync(fd);
  }
}

/**
 * Reads the LoRA adapter at `path` for a model of config `model`: a PEFT folder, or a llama.cpp
 * GGUF LoRA file (gguf-adapter.ts). Throws LoraError naming the adapter_config.json or GGUF
 * metadata key (`field`) or the tensor (`tensor`) at fault: an unsupported feature, a rank over
 * `maxRank` (`r`), another base model or architecture, a tensor missing, unexpected, of the wrong
 * shape or dtype, truncated or non-finite.
 */
export function readLoraAdapter(path: string, model: ModelConfig, opts: ReadAdapterOptions): LoraAdapterData {
  if (!existsSync(path)) throw new LoraError(path, "does not exist: a LoRA adapter is a PEFT folder or a llama.cpp GGUF LoRA file");
  if (statSync(path).isDirectory()) return readPeftAdapter(path, model, opts);
  if (isGgufAdapterPath(path)) return readGgufLoraAdapter(path, model, opts.maxRank);
  throw new LoraError(path, `is a file but not a GGUF file: a LoRA adapter is a PEFT folder (${ADAPTER_CONFIG} + ${ADAPTER_WEIGHTS}) or a llama.cpp GGUF LoRA file`);
}
