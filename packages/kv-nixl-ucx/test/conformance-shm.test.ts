// rm-core conformance for nixl-ucx with UCX over shared memory (UCX_TLS=posix,self: one-sided gets from UCX-allocated memory).
import { afterAll, beforeAll, test } from "vitest";
import { kvTransportSuite, type ConformanceFixture } from "@airm/rm-core";
import { nixlUcxConformance, shutdownEngines } from "../src/index.ts";

let fixture: ConformanceFixture;
beforeAll(async () => {
  fixture = await nixlUcxConformance({ tls: "posix,self" });
});
afterAll(async () => {
  await fixture?.teardown();
  await shutdownEngines();
});

kvTransportSuite({ test, factory: () => fixture.factory() });
