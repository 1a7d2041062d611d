// Discovery from a real host folder laid out like pnpm's strict node_modules (a symlinked
// dependency whose package.json declares an `airm` field), in child processes where global state
// matters.
import { mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync, cpSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { execFileSync } from "node:child_process";
import { fileURLToPath, pathToFileURL } from "node:url";
import { createRequire } from "node:module";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { Registry, UnknownPluginError, PluginShapeError, isAirmError } from "../src/index.ts";

const tsxLoader = pathToFileURL(createRequire(import.meta.url).resolve("tsx")).href;
const rmCoreSrc = fileURLToPath(new URL("../src/", import.meta.url));
let root: string;
let host: string;

function writePlugin(dir: string, name: string, airm: unknown, code: string): void {
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, "package.json"), JSON.stringify({ name, version: "1.0.0", type: "module", exports: { ".": "./index.mjs", "./package.json": "./package.json" }, airm }));
  writeFileSync(join(dir, "index.mjs"), code);
}

beforeAll(() => {
  root = mkdtempSync(join(tmpdir(), "airm-registry-"));
  host = join(root, "host");
  const store = join(root, "store");
  const config = `{ resolve: () => ({}) }`;
  const transport = `export const demo = { kind: "kv_transport", name: "demo", config: ${config}, support: { scope: ["same-host"], tiers: ["host-dram"], dtypes: ["bf16"], layouts: ["rngd-pd/v1"], copyOnly: false }, async create() { return { name: "demo" }; } };
globalThis.__demoImports = (globalThis.__demoImports ?? 0) + 1;`;
  writePlugin(join(store, "demo-plugin"), "demo-plugin", { kv_transports: { demo: { export: "demo" } } }, transport);
  writePlugin(join(store, "bad-shape"), "bad-shape", { kv_transports: { broken: { export: "broken" } } }, `export const broken = { kind: "kv_transport", name: "broken" };`);
  writePlugin(join(store, "no-export"), "no-export", { workloads: { ghost: { export: "ghost" } } }, `export const other = 1;`);
  writePlugin(
    join(store, "engine-x"),
    "engine-x",
    { workloads: { ex: { export: "ex", backends: { "ex-fast": { roles: ["decode"] } } } } },
    `export const ex = { kind: "engine", name: "ex", config: ${config}, async load() { return {}; } };`,
  );
  writePlugin(
    join(store, "lazy-x"),
    "lazy-x",
    { workloads: { lazy: { export: "lazy", backends: { lz: { roles: ["solo"] } } } } },
    `globalThis.__lazyImports = 1; export const lazy = {};`,
  );
  // a second package declaring "demo": refused where the clash is visible (AIRM_PLUGINS test below)
  writePlugin(join(store, "demo-again"), "demo-again", { kv_transports: { demo: { export: "demo" } } }, transport);
  writePlugin(join(store, "extra-plugin"), "extra-plugin", { kv_transports: { extra: { export: "extra", sidecar: { name: "x" } } } }, transport.replaceAll("demo", "extra"));
  writePlugin(join(store, "not-a-dep"), "not-a-dep", { kv_transports: { hidden: {} } }, `export default {};`);
  mkdirSync(join(host, "node_modules"), { recursive: true });
  for (const p of ["demo-plugin", "bad-shape", "no-export", "engine-x", "lazy-x"]) symlinkSync(join(store, p), join(host, "node_modules", p), "dir");
  writeFileSync(
    join(host, "package.json"),
    JSON.stringify({
      name: "host",
      type: "module",
      dependencies: { "demo-plugin": "1", "bad-shape": "1", "no-export": "1", "engine-x": "1", "lazy-x": "1" },
      optionalDependencies: { "absent-optional": "1" },
    }),
  );
});
afterAll(() => rmSync(root, { recursive: true, force: true }));

describe("registry discovery", () => {
  test("lists what the host's dependencies declare, per group", () => {
    const r = new Registry();
    r.addHost(host);
    expect(r.list("airm.kv_transports")).toEqual(["broken", "demo"]);
    expect(r.list("airm.workloads")).toEqual(["ex", "ghost", "lazy"]);
    expect(r.sourceOf("airm.kv_transports", "demo")).toBe("demo-plugin");
  });

  test("loads lazily, once per process", async () => {
    const r = new Registry();
    r.addHost(host);
    const g = globalThis as { __demoImports?: number };
    const before = g.__demoImports ?? 0;
    const a = await r.load("airm.kv_transports", "demo");
    const b = await r.load("airm.kv_transports", "demo");
    expect(a).toBe(b);
    expect(a.name).toBe("demo");
    expect((g.__demoImports ?? 0) - before).toBeLessThanOrEqual(1);
    const e = await r.load("airm.workloads", "ex");
    expect(e.kind).toBe("engine");
  });

  test("an unknown name lists the installed ones", async () => {
    const r = new Registry();
    r.addHost(host);
    const err = await r.load("airm.kv_transports", "nope").catch((e) => e);
    expect(err).toBeInstanceOf(UnknownPluginError);
    expect(err.message).toContain('group "airm.kv_transports"');
    expect(err.message).toContain("broken, demo");
    expect(err.installed).toEqual(["broken", "demo"]);
  });

  test("a plugin of the wrong shape is an error naming its package", async () => {
    const r = new Registry();
    r.addHost(host);
    const err = await r.load("airm.kv_transports", "broken").catch((e) => e);
    expect(err).toBeInstanceOf(PluginShapeError);
    expect(err.message).toContain('"bad-shape"');
    expect(err.message).toContain("create");
    const err2 = await r.load("airm.workloads", "ghost").catch((e) => e);
    expect(isAirmError(err2, "PLUGIN_SHAPE")).toBe(true);
    expect(err2.message).toContain('"no-export"');
    expect(err2.message).toContain('no export "ghost"');
  });

  test("a host folder without a package.json is a config error, not a silent fallback", () => {
    expect(() => new Registry().addHost("/nonexistent-host-root/x")).toThrow(/no package.json at or above/);
  });

  test("packages that are not dependencies of the host are not offered", () => {
    const r = new Registry();
    r.addHost(host);
    expect(r.list("airm.kv_transports")).not.toContain("hidden");
  });

  test("entries() tells what a package.json entry declares without importing the plugin", () => {
    const r = new Registry();
    r.addHost(host);
    expect(r.entry("airm.workloads", "ex")).toEqual({
      group: "airm.workloads",
      name: "ex",
      source: "engine-x",
      dir: expect.stringContaining("engine-x"),
      meta: { backends: { "ex-fast": { roles: ["decode"] } } },
    });
    expect(r.entries("airm.kv_transports").map((e) => e.name)).toEqual(["broken", "demo"]);
    expect(r.entry("airm.workloads", "lazy")?.meta).toEqual({ backends: { lz: { roles: ["solo"] } } });
    expect((globalThis as { __lazyImports?: number }).__lazyImports).toBeUndefined();
  });

  test("a plugin without a config spec is refused with its package named", async () => {
    const r = new Registry();
    r.register("airm.kv_transports", { load: async () => ({ kind: "kv_transport", name: "noconf", support: {}, create: async () => ({}) }) as never, name: "noconf" });
    const err = await r.load("airm.kv_transports", "noconf").catch((e) => e);
    expect(err).toBeInstanceOf(PluginShapeError);
    expect(err.message).toContain("plugin.config must be a ConfigSpec");
  });

  test("register() adds a plugin by hand and wins over discovery", async () => {
    const r = new Registry();
    r.addHost(host);
    const mine = {
      kind: "kv_transport" as const,
      name: "demo",
      support: { scope: [], tiers: [], dtypes: [], layouts: [], copyOnly: false },
      config: { resolve: () => ({}) } as never,
      create: async () => ({}) as never,
    };
    r.register("airm.kv_transports", mine);
    expect(await r.load("airm.kv_transports", "demo")).toBe(mine);
    expect(r.sourceOf("airm.kv_transports", "demo")).toBe("(registered)");
  });
});

describe("one registry per process", () => {
  test("two copies of rm-core share the registry and its plugins (child process)", () => {
    const copy = join(root, "copy-of-rm-core", "src");
    cpSync(rmCoreSrc, copy, { recursive: true });
    // a second installed copy: its own package.json and its own view of the dependencies
    writeFileSync(join(copy, "..", "package.json"), JSON.stringify({ name: "@airm/rm-core", type: "module" }));
    symlinkSync(fileURLToPath(new URL("../node_modules", import.meta.url)), join(copy, "..", "node_modules"), "dir");
    const script = `
      const a = await import(${JSON.stringify(join(rmCoreSrc, "index.ts"))});
      const b = await import(${JSON.stringify(join(copy, "index.ts"))});
      if (a.Registry === b.Registry) throw new Error("not two copies");
      a.registry.addHost(${JSON.stringify(host)});
      const p1 = await a.registry.load("airm.kv_transports", "demo");
      const p2 = await b.registry.load("airm.kv_transports", "demo");
      const err = await b.registry.load("airm.kv_transports", "zzz").catch((e) => e);
      console.log(JSON.stringify({ same: a.registry === b.registry, plugin: p1 === p2, crossBrand: a.isAirmError(err, "UNKNOWN_PLUGIN"), imports: globalThis.__demoImports }));
    `;
    const out = execFileSync(process.execPath, ["--import", tsxLoader, "--input-type=module", "-e", script], { cwd: host, encoding: "utf8" });
    expect(JSON.parse(out.trim().split("\n").pop()!)).toEqual({ same: true, plugin: true, crossBrand: true, imports: 1 });
  });

  test("AIRM_PLUGINS adds plugin folders; a name two packages declare is refused naming both (child process)", () => {
    const script = `
      const { registry } = await import(${JSON.stringify(join(rmCoreSrc, "index.ts"))});
      registry.addHost(${JSON.stringify(host)});
      const names = registry.list("airm.kv_transports");
      const sidecar = registry.entry("airm.kv_transports", "extra").meta.sidecar;
      const err = await registry.load("airm.kv_transports", "demo").catch((e) => e);
      console.log(JSON.stringify({ names, sidecar, code: err.code, message: err.message }));
    `;
    const env = { ...process.env, AIRM_PLUGINS: [join(root, "store", "extra-plugin"), join(root, "store", "demo-again")].join(":") };
    const out = execFileSync(process.execPath, ["--import", tsxLoader, "--input-type=module", "-e", script], { cwd: host, encoding: "utf8", env });
    const r = JSON.parse(out.trim().split("\n").pop()!);
    expect(r.names).toEqual(["broken", "demo", "extra"]);
    expect(r.sidecar).toEqual({ name: "x" });
    expect(r.code).toBe("PLUGIN_SHAPE");
    expect(r.message).toContain('"demo-plugin" and "demo-again"');
  });

  test("with no host added, the package around the working directory is the host (child process)", () => {
    const script = `
      const { registry } = await import(${JSON.stringify(join(rmCoreSrc, "index.ts"))});
      console.log(JSON.stringify(registry.list("airm.kv_transports")));
    `;
    const out = execFileSync(process.execPath, ["--import", tsxLoader, "--input-type=module", "-e", script], { cwd: join(host, "node_modules"), encoding: "utf8" });
    expect(JSON.parse(out.trim().split("\n").pop()!)).toEqual(["broken", "demo"]);
  });
});
