// The largest source files and functions of the packages (src/, tests excluded), by lines: what a
// newcomer meets first, and what the function-size test holds. `pnpm exec tsx scripts/code-size.ts
// [--top 10] [--root DIR]` (DIR: another checkout, to compare before and after a change).
import { join } from "node:path";
import ts from "typescript";
import { packageSources, packages } from "../test/source-files.ts";

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

/** The `top` largest files and functions under `root`'s packages/*\/src. */
export function codeSize(root: string, top: number): { files: [string, number][]; functions: [string, number][] } {
  const files: [string, number][] = [];
  const functions: [string, number][] = [];
  for (const [file, text] of packages(root).flatMap((pkg) => packageSources(pkg, root))) {
    if (!file.endsWith(".ts")) continue;
    files.push([file, text.split("\n").length - (text.endsWith("\n") ? 1 : 0)]);
    functions.push(...functionLengths(file, text));
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
