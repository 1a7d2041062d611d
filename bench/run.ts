// `pnpm bench <name> [args...]` runs bench/<name>.ts with the remaining arguments.
import { existsSync, readdirSync } from "node:fs";
import { spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import { dirname, join } from "node:path";

const here = dirname(fileURLToPath(import.meta.url));
const [name, ...args] = process.argv.slice(2);
const names = readdirSync(here)
  .filter((f) => f.endsWith(".ts") && !["run.ts", "lib.ts"].includes(f))
  .map((f) => f.slice(0, -3));
if (!name || !existsSync(join(here, `${name}.ts`))) {
  console.error(`usage: pnpm bench <name> [args...]\nbenches: ${names.join(", ")}`);
  process.exit(2);
}
const r = spawnSync(process.execPath, ["--import", "tsx", join(here, `${name}.ts`), ...args], { stdio: "inherit" });
process.exit(r.status ?? 1);
