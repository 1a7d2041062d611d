// The rm-core conformance cases against the tcp transport and an in-process relay on a free port.
import { kvTransportSuite, type ConformanceFixture } from "@airm/rm-core";
import { afterAll, beforeAll, test } from "vitest";
import { tcpTransport } from "../src/index.ts";

let fixture: ConformanceFixture;
beforeAll(async () => {
  fixture = await tcpTransport.conformance!({});
});
afterAll(async () => {
  await fixture?.teardown();
});

kvTransportSuite({ test, factory: () => fixture.factory() });
