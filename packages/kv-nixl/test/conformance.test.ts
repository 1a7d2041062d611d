// rm-core's KV transport conformance for `nixl`: a real sidecar with a real NIXL agent (the PyPI
// wheels), two endpoints with their own registered arenas, every blob crossing by a NIXL READ.
// Without the wheels every case is reported skipped with the reason.
import { existsSync } from "node:fs";
import { afterAll, beforeAll, test } from "vitest";
import { kvTransportCases, kvTransportSuite, type ConformanceFixture } from "@airm/rm-core";
import { defaultNixlPython, nixlConformance } from "../src/index.ts";

const missing = existsSync(defaultNixlPython()) ? null : `the NIXL wheels are not installed (no ${defaultNixlPython()}); run scripts/tools/nixl.sh`;
let fixture: ConformanceFixture;
beforeAll(async () => {
  if (!missing) fixture = await nixlConformance({});
}, 120_000);
afterAll(async () => {
  await fixture?.teardown();
});

kvTransportSuite({
  test,
  factory: () => fixture.factory(),
  ...(missing ? { skip: Object.fromEntries(kvTransportCases.map((c) => [c.id, missing])) } : {}),
});
