// xgrammar loaded in the test's own thread (as the grammar thread loads it), for checking what a
// grammar accepts character by character (its Testings.isGrammarAcceptString).
import { readFileSync } from "node:fs";
import Module, { createRequire } from "node:module";

const require = createRequire(import.meta.url);

export function loadXgrammar(): any {
  const file = require.resolve("@mlc-ai/web-xgrammar");
  const m = new Module(file) as Module & { _compile(src: string, file: string): void; paths: string[] };
  m.filename = file;
  m.paths = (Module as unknown as { _nodeModulePaths(p: string): string[] })._nodeModulePaths(file);
  m._compile(readFileSync(file, "utf8"), file);
  return m.exports;
}
