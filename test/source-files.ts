// The repository's TypeScript sources, for the checks that read code as text.
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { join, relative } from "node:path";

export const root = join(import.meta.dirname, "..");

function walk(dir: string, out: string[]): string[] {
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    if (e.name === "node_modules" || e.name === "dist") continue;
    const p = join(dir, e.name);
    if (e.isDirectory()) walk(p, out);
    else if (/\.(ts|mjs)$/.test(e.name)) out.push(p);
  }
  return out;
}

/** Source files (not tests) of `pkg`'s src/ folder, as [path relative to `at`, text]; `at`: this checkout, or another. */
export function packageSources(pkg: string, at = root): [string, string][] {
  const src = join(at, "packages", pkg, "src");
  if (!existsSync(src)) return [];
  return walk(src, [])
    .filter((f) => !f.endsWith(".test.ts"))
    .map((f) => [relative(at, f), readFileSync(f, "utf8")]);
}

/** Every package folder name (of this checkout, or of `at`). */
export function packages(at = root): string[] {
  return readdirSync(join(at, "packages"), { withFileTypes: true })
    .filter((e) => e.isDirectory())
    .map((e) => e.name);
}

/** Sources (not tests) of every package, plus bench/ and scripts/. */
export function allSources(): [string, string][] {
  const extra = [...walk(join(root, "bench"), []), ...walk(join(root, "scripts"), [])].map((f) => [relative(root, f), readFileSync(f, "utf8")] as [string, string]);
  return [...packages().flatMap((pkg) => packageSources(pkg)), ...extra];
}
