// rm-core conformance for nixl-ucx with UCX over TCP (UCX_TLS=tcp for these endpoints).
import { afterAll, beforeAll, test } from "vitest";
import { kvTransportSuite, type ConformanceFixture } from "@airm/rm-core";
import { nixlUcxConformance, shutdownEngines } from "../src/index.ts";

let fixture: ConformanceFixture;
beforeAll(async () => {
  fixture = await nixlUcxConformance({ tls: "tcp" });
});
afterAll(async () => {
  await fixture?.teardown();
  await shutdownEngines();
});

kvTransportSuite({ test, factory: () => fixture.factory() });
