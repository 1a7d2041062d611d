// The hosts' functions stay short enough to read on a screen or two: none over 120 lines in
// worker, gateway or workload-runner (measured with the TypeScript parser, nested functions
// counted inside their parent too).
import ts from "typescript";
import { describe, expect, test } from "vitest";
import { packageSources } from "./source-files.ts";

const LIMIT = 120;

/** [name, lines] of every function-like node of a source file. */
function functionLengths(file: string, text: string): [string, number][] {
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

describe("function size", () => {
  test.each(["worker", "gateway", "workload-runner"])(`no function in %s is over ${LIMIT} lines`, (pkg) => {
    const all = packageSources(pkg).flatMap(([file, text]) => (file.endsWith(".ts") ? functionLengths(file, text) : []));
    expect(all.length).toBeGreaterThan(10);
    expect(all.filter(([, n]) => n > LIMIT)).toEqual([]);
  });
});
