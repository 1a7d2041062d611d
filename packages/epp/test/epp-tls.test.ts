// The picker with AIRM_TLS_DIR's material (certificates made by openssl): it scrapes an endpoint
// whose port is mutual TLS by presenting its certificate, and an endpoint that speaks plain HTTP
// (a gateway) in plain HTTP; its ext_proc port serves TLS, which a client trusting the CA uses and
// a plain client cannot; its health port stays plain. A picker without the material cannot scrape
// the TLS endpoint, and one with a certificate of another CA is refused by it. After its folder is
// renewed with another CA's files (AIRM_TLS_RELOAD_S) it scrapes and serves with those.

import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createCa, issueLeaf, LiveTlsMaterial, loadTlsDir, makeTlsTestDirs, type TlsTestDirs, tlsMaterialOf, writeSecretVolume } from "@airm/rm-core";
import type { Endpoint } from "@airm/routing";
import { afterAll, afterEach, beforeAll, expect, test, vi } from "vitest";
import { startEpp, StaticEndpoints, type Epp, type EppOptions } from "../src/index.ts";
import { EnvoyStub, startFakeModelServer, type FakeModelServer } from "../src/testing/index.ts";

let root: string;
let dirs: TlsTestDirs;
const cleanup: (() => Promise<void> | void)[] = [];

beforeAll(() => {
  root = mkdtempSync(join(tmpdir(), "airm-epp-tls-"));
  dirs = makeTlsTestDirs(root);
});
afterEach(async () => {
  while (cleanup.length) await cleanup.pop()!();
});
afterAll(() => {
  if (root) rmSync(root, { recursive: true, force: true });
});

async function server(load: { waiting: number }, tlsDir?: string): Promise<FakeModelServer> {
  const s = await startFakeModelServer(load, tlsDir ? loadTlsDir(tlsDir) : undefined);
  cleanup.push(() => s.close());
  return s;
}

async function picker(endpoints: Endpoint[], options: Partial<EppOptions>): Promise<Epp> {
  const file = join(mkdtempSync(join(root, "eps-")), "endpoints.json");
  writeFileSync(file, JSON.stringify(endpoints));
  const epp = await startEpp({ source: new StaticEndpoints(file, { pollMs: 25 }), grpcPort: 0, metricsPort: null, healthPort: 0, scrapeIntervalMs: 20, ...options });
  cleanup.push(() => epp.close());
  await epp.scraper.settled();
  return epp;
}

const state = (epp: Epp, port: number) => epp.scraper.states().find((s) => s.endpoint.port === port)!;

test("scrapes a mutual-TLS worker with its certificate and a plain gateway in plain HTTP, and picks over TLS", async () => {
  const worker = await server({ waiting: 0 }, dirs.good);
  const gateway = await server({ waiting: 3 });
  const epp = await picker([worker.endpoint("decode", "tls-worker"), gateway.endpoint("decode", "plain-gateway")], { tls: loadTlsDir(dirs.good) });
  expect(epp.tls).toBe(true);
  expect(state(epp, worker.port)).toMatchObject({ scheme: "https", error: null, load: { waiting: 0 } });
  expect(state(epp, gateway.port)).toMatchObject({ scheme: "http", error: null, load: { waiting: 3 } });
  const envoy = new EnvoyStub(epp.address, loadTlsDir(dirs.good).ca);
  cleanup.push(() => envoy.close());
  const a = await envoy.request({ body: JSON.stringify({ model: "tiny", prompt: "hi", max_tokens: 4 }) });
  expect(a.setHeaders["x-gateway-destination-endpoint"]).toBe(`127.0.0.1:${worker.port}`);
});

test("a plain client cannot use the TLS ext_proc port", async () => {
  const worker = await server({ waiting: 0 }, dirs.good);
  const epp = await picker([worker.endpoint("decode")], { tls: loadTlsDir(dirs.good) });
  const envoy = new EnvoyStub(epp.address);
  cleanup.push(() => envoy.close());
  const err = await envoy.request({ body: JSON.stringify({ model: "tiny", prompt: "hi" }) }).then(
    () => null,
    (e: Error) => e.message,
  );
  expect(err).toMatch(/UNAVAILABLE|Connection dropped|failed to connect|No connection established/);
});

test("a picker without a certificate, or with one of another CA, cannot scrape a mutual-TLS worker", async () => {
  const worker = await server({ waiting: 0 }, dirs.good);
  const none = await picker([worker.endpoint("decode")], {});
  expect(state(none, worker.port).load).toBeNull();
  expect(state(none, worker.port).error).not.toBeNull();
  // Read as is: loadTlsDir itself refuses a folder whose certificate its ca.crt did not issue.
  const file = (name: string) => readFileSync(join(dirs.foreign, name));
  const foreign = new LiveTlsMaterial(dirs.foreign, { cert: file("tls.crt"), key: file("tls.key"), ca: file("ca.crt") });
  const other = await picker([worker.endpoint("decode")], { tls: foreign });
  expect(state(other, worker.port).load).toBeNull();
  expect(state(other, worker.port).error).not.toBeNull();
  expect(worker.scrapes).toBe(0);
});

test("after its TLS folder is renewed with another CA's files, it scrapes with the new certificate and serves it on the ext_proc port", async () => {
  const caA = createCa(join(root, "renew-ca-a"), "first CA");
  const caB = createCa(join(root, "renew-ca-b"), "second CA");
  const volume = join(root, "renew-volume");
  writeSecretVolume(volume, issueLeaf(caA, join(root, "renew-a")));
  const material = tlsMaterialOf(volume, { reloadS: 0.05 })!;
  const worker = await server({ waiting: 1 }, issueLeaf(caB, join(root, "renew-worker")));
  const epp = await picker([worker.endpoint("decode", "tls-worker")], { tls: material });
  expect(state(epp, worker.port).load).toBeNull(); // neither trusts the other's CA yet
  const caOfB = readFileSync(caB.cert);

  writeSecretVolume(volume, issueLeaf(caB, join(root, "renew-b")));
  await vi.waitFor(() => expect(material.generation).toBe(1), { timeout: 5000 });
  await vi.waitFor(() => expect(state(epp, worker.port)).toMatchObject({ error: null, load: { waiting: 1 } }), { timeout: 5000 });
  const envoy = new EnvoyStub(epp.address, caOfB);
  cleanup.push(() => envoy.close());
  const a = await envoy.request({ body: JSON.stringify({ model: "tiny", prompt: "hi", max_tokens: 4 }) });
  expect(a.setHeaders["x-gateway-destination-endpoint"]).toBe(`127.0.0.1:${worker.port}`);
});
