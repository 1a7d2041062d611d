// WorkerClient over mutual TLS against a real HTTPS server with certificates made by openssl:
// Node's global fetch takes the undici Agent of tls-dispatcher.ts as its dispatcher (which holds
// only while undici's major is the one Node bundles), presents the client certificate, and an
// http URL with TLS is refused at once.

import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createServer, type Server } from "node:https";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { TLSSocket } from "node:tls";
import { ConfigError, loadTlsDir, makeTlsTestDirs, serverTlsOptions, type TlsMaterial } from "@airm/rm-core";
import { Agent } from "undici";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { WorkerClient } from "../src/index.ts";

let root: string;
let tls: TlsMaterial;
let server: Server;
let url: string;
const seen: { cn: string; path: string }[] = [];
/** The server's failed handshakes: the error code and the verification's. */
const refused: string[] = [];

beforeAll(async () => {
  root = mkdtempSync(join(tmpdir(), "airm-tls-client-"));
  tls = loadTlsDir(makeTlsTestDirs(root).good);
  server = createServer(serverTlsOptions(tls), (req, res) => {
    const peer = (req.socket as TLSSocket).getPeerCertificate();
    seen.push({ cn: String(peer.subject?.CN), path: req.url ?? "" });
    res.setHeader("content-type", "application/json");
    req.on("end", () => res.end(JSON.stringify(req.url === "/health" ? { status: "ok" } : { tokenIds: [1, 2, 3] }))).resume();
  });
  server.on("tlsClientError", (e: NodeJS.ErrnoException) => refused.push(String(e.code)));
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", () => r()));
  url = `https://127.0.0.1:${(server.address() as { port: number }).port}`;
});
afterAll(async () => {
  await new Promise((r) => server.close(r));
  rmSync(root, { recursive: true, force: true });
});

describe("WorkerClient over mutual TLS", () => {
  test("undici's major is the one Node's fetch bundles (its Agent is then a dispatcher fetch accepts)", () => {
    const pkg = createRequire(import.meta.url)("undici/package.json") as { version: string };
    expect(pkg.version.split(".")[0]).toBe(process.versions.undici?.split(".")[0]);
  });

  test("calls present the part's certificate and verify the worker's", async () => {
    const c = new WorkerClient(url, "worker", { tls });
    expect((await c.health()).status).toBe(200);
    await c.tokenize({ input: { prompt: "hi" } }).catch(() => {}); // this server's answer is outside the contract: what matters is that the call arrived
    expect(seen).toEqual([
      { cn: "airm", path: "/health" },
      { cn: "airm", path: "/internal/tokenize" },
    ]);
  });

  test("without the client certificate the server refuses the handshake", async () => {
    const ca = readFileSync(join(tls.dir, "ca.crt"));
    const dispatcher = new Agent({ connect: { ca, checkServerIdentity: () => undefined } });
    const r = await fetch(`${url}/health`, { dispatcher } as RequestInit).catch((e: Error) => e);
    expect(r).toBeInstanceOf(TypeError); // fetch failed: no answer at all
    expect(refused).toEqual(["ERR_SSL_PEER_DID_NOT_RETURN_A_CERTIFICATE"]);
    expect(seen.filter((s) => s.cn !== "airm")).toEqual([]);
  });

  test("refuses a worker whose certificate the deployment's CA did not issue", async () => {
    const foreign = join(root, "foreign");
    const impostor = createServer({ cert: readFileSync(join(foreign, "tls.crt")), key: readFileSync(join(foreign, "tls.key")) }, (_req, res) => res.end("{}"));
    await new Promise<void>((r) => impostor.listen(0, "127.0.0.1", () => r()));
    try {
      const c = new WorkerClient(`https://127.0.0.1:${(impostor.address() as { port: number }).port}`, "worker", { tls });
      const e = await c.health().catch((err: Error) => err);
      expect(((e as Error).cause as { code?: string }).code).toBe("UNABLE_TO_VERIFY_LEAF_SIGNATURE");
    } finally {
      await new Promise((r) => impostor.close(r));
    }
  });

  test("an http URL with TLS is a ConfigError", () => {
    expect(() => new WorkerClient(url.replace("https", "http"), "w", { tls })).toThrow(ConfigError);
  });
});
