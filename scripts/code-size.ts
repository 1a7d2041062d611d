// The largest source files and functions of the packages (src/, tests excluded), by lines: what a
// newcomer meets first, and what the function-size test holds. `pnpm exec tsx scripts/code-size.ts
// [--top 10] [--root DIR]` (DIR: another checkout, to compare before and after a change).
import { readdirSync, readFileSync } from "node:fs";
import { join, relative } from "node:path";
import ts from "typescript";

/** [file:line name, lines] of every function-like node of a source file (nested ones too). */
export function functionLengths(file: string, text: string): [string, number][] {
  const sf = ts.createSourceFile(file, text, ts.ScriptTarget.ES2022, true);
  const out: [string, number][] = [];
  const visit = (node: ts.Node) => {
    if (ts.isFunctionDeclaration(node) || ts.isMethodDeclaration(node) || ts.isArrowFunction(node) || ts.isFunctionExpression(node) || ts.isConstructorDeclaration(node)) {
      const start = sf.getLineAndCharacterOfPosition(node.getStart(sf)).line;
      const end = sf.getLineAndCharacterOfPosition(node.getEnd()).line;
      const name = (node as { name?: ts.Node }).name?.getText(sf) ?? (ts.isVariableDeclaration(node.parent) ? node.parent.name.getText(sf) : "(anonymous)");
      out.push([`${file}:${start + 1} ${name}`, end - start + 1]);
    }
    ts.forEachChild(node, visit);
  };
  visit(sf);
  return out;
}

function walk(dir: string, out: string[]): string[] {
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    if (e.name === "node_modules" || e.name === "dist") continue;
    const p = join(dir, e.name);
    if (e.isDirectory()) walk(p, out);
    else if (e.name.endsWith(".ts") && !e.name.endsWith(".test.ts")) out.push(p);
  }
  return out;
}

/** The `top` largest files and functions under `root`'s packages/*\/src. */
export function codeSize(root: string, top: number): { files: [string, number][]; functions: [string, number][] } {
  const files: [string, number][] = [];
  const functions: [string, number][] = [];
  for (const pkg of readdirSync(join(root, "packages"), { withFileTypes: true })) {
    if (!pkg.isDirectory()) continue;
    let sources: string[] = [];
    try {
      sources = walk(join(root, "packages", pkg.name, "src"), []);
    } catch {
      continue;
    }
    for (const f of sources) {
      const text = readFileSync(f, "utf8");
      const rel = relative(root, f);
      files.push([rel, text.split("\n").length - (text.endsWith("\n") ? 1 : 0)]);
      functions.push(...functionLengths(rel, text));
    }
  }
  const largest = (xs: [string, number][]) => xs.sort((a, b) => b[1] - a[1]).slice(0, top);
  return { files: largest(files), functions: largest(functions) };
}

if (import.meta.main) {
  const arg = (name: string) => {
    const i = process.argv.indexOf(name);
    return i > 0 ? process.argv[i + 1] : undefined;
  };
  const root = arg("--root") ?? join(import.meta.dirname, "..");
  const top = Number(arg("--top") ?? 10);
  const { files, functions } = codeSize(root, top);
  console.log(`largest files (lines):\n${files.map(([f, n]) => `  ${String(n).padStart(5)}  ${f}`).join("\n")}`);
  console.log(`largest functions (lines):\n${functions.map(([f, n]) => `  ${String(n).padStart(5)}  ${f}`).join("\n")}`);
}
