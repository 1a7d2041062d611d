import { afterAll, test } from "vitest";
import { kvTransportSuite } from "@airm/rm-core";
import { shmTransport } from "../src/index.ts";

const fixture = await shmTransport.conformance!({});
afterAll(() => fixture.teardown());

kvTransportSuite({ test, factory: fixture.factory });
