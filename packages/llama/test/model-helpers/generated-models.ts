// Generates tiny models with the real `airm-model make-tiny` CLI (a child process) into a temp
// folder, once per test file, so end-to-end model tests run on the loader's real output.
import { execFileSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

const cli = fileURLToPath(new URL("../../bin/airm-model.mjs", import.meta.url));

/** The flags each golden model is made with (kept in the goldens file too). */
export const GOLDEN_MODELS: Record<string, string[]> = {
  llama: ["--arch", "llama", "--seed", "7", "--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2"],
  qwen2: ["--arch", "qwen2", "--seed", "7", "--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "1", "--shards", "2"],
  qwen3: ["--arch", "qwen3", "--seed", "7", "--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2"],
  gemma3: ["--arch", "gemma3", "--seed", "3", "--layers", "3", "--hidden", "64", "--heads", "4", "--kv-heads", "1", "--sliding-window", "6"],
};

export interface GeneratedModels {
  dirs: Record<string, string>;
  cleanup(): void;
}

export function generateModels(which: Record<string, string[]> = GOLDEN_MODELS): GeneratedModels {
  const root = mkdtempSync(join(tmpdir(), "llama-gen-"));
  const dirs: Record<string, string> = {};
  for (const [name, flags] of Object.entries(which)) {
    const out = join(root, name);
    execFileSync(process.execPath, [cli, "make-tiny", ...flags, "--out", out], { stdio: "pipe", timeout: 120_000 });
    dirs[name] = out;
  }
  return { dirs, cleanup: () => rmSync(root, { recursive: true, force: true }) };
}
