// Installs the pnpm the root package.json's `packageManager` names, without npm or corepack
// (the local base has only the node binary): the registry's @pnpm/exe.<platform> tarball,
// checked against the registry's sha512 integrity, unpacked to /usr/local/lib/pnpm and linked
// as /usr/local/bin/pnpm. Usage: node install-pnpm.mjs <package.json>. Honours npm_config_registry.
import { execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import { mkdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";

const pkg = JSON.parse(readFileSync(process.argv[2] ?? "package.json", "utf8"));
const [name, version] = String(pkg.packageManager ?? "").split("@");
if (name !== "pnpm" || !version) throw new Error(`packageManager is not pnpm@<version>: ${pkg.packageManager}`);
// biome-ignore lint/suspicious/noUndeclaredEnvVars: the npm registry pnpm itself would use (a build step, not a turbo task)
const registry = (process.env.npm_config_registry || "https://registry.npmjs.org").replace(/\/+$/, "");
const exe = `@pnpm/exe.${process.platform}-${process.arch}`;
const metaRes = await fetch(`${registry}/${exe.replace("/", "%2f")}/${version}`);
if (!metaRes.ok) throw new Error(`${exe}@${version}: registry answered ${metaRes.status}`);
const { dist } = await metaRes.json();
const res = await fetch(dist.tarball);
if (!res.ok) throw new Error(`${dist.tarball}: ${res.status}`);
const tgz = Buffer.from(await res.arrayBuffer());
const [algo, want] = dist.integrity.split(/-(.*)/s);
const got = createHash(algo).update(tgz).digest("base64");
if (got !== want) throw new Error(`${exe}@${version}: integrity mismatch`);
const dir = "/usr/local/lib/pnpm";
rmSync(dir, { recursive: true, force: true });
mkdirSync(dir, { recursive: true });
writeFileSync("/tmp/pnpm-exe.tgz", tgz);
execFileSync("tar", ["-xzf", "/tmp/pnpm-exe.tgz", "-C", dir, "--strip-components=1", "--no-same-owner"]);
rmSync("/tmp/pnpm-exe.tgz");
rmSync("/usr/local/bin/pnpm", { force: true });
symlinkSync(`${dir}/pnpm`, "/usr/local/bin/pnpm");
console.log(execFileSync("/usr/local/bin/pnpm", ["--version"], { encoding: "utf8" }).trim());
