// The real workspace as a host: the repository root lists the transport packages as
// dependencies and imports none of them; the registry must still find them by name.
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { expect, test } from "vitest";
import { Registry, isAirmError } from "../src/index.ts";

const repoRoot = fileURLToPath(new URL("../../../", import.meta.url));

test("registry.load('airm.kv_transports', 'shm') from a host that lists @airm/kv-shm without importing it", async () => {
  const pkg = JSON.parse(readFileSync(`${repoRoot}/package.json`, "utf8")) as { dependencies: Record<string, string> };
  expect(pkg.dependencies["@airm/kv-shm"]).toBeDefined();
  const r = new Registry();
  r.addHost(repoRoot);
  const shm = await r.load("airm.kv_transports", "shm");
  expect(shm.kind).toBe("kv_transport");
  expect(shm.name).toBe("shm");
  expect(shm.support.scope).toEqual(["same-host"]);
  expect(r.sourceOf("airm.kv_transports", "shm")).toBe("@airm/kv-shm");
  const err = await r.load("airm.kv_transports", "carrier-pigeon").catch((e) => e);
  expect(isAirmError(err, "UNKNOWN_PLUGIN")).toBe(true);
  expect(err.installed).toContain("shm");
  expect(err.message).toMatch(/installed: .*shm/);
});
