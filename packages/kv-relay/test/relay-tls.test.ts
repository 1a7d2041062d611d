// The relay over mutual TLS (AIRM_TLS_DIR): a real airm-kv-relay process and certificates made by
// openssl. A client with the deployment's certificate pushes and pulls blobs of every size through
// the staged `onread` reader over TLS, each CRC-checked as over plain TCP; a caller with no
// certificate, one of another CA or an expired one is refused at the handshake (no frame is ever
// answered), counted and logged with the reason; a plain TCP client gets nothing either. A client
// whose folder is renewed (AIRM_TLS_RELOAD_S) opens its next connections with the new files.

import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import tls from "node:tls";
import {
  createCa,
  issueLeaf,
  kvCrc32,
  LiveTlsMaterial,
  loadTlsDir,
  makeTlsTestDirs,
  newInternalToken,
  patternBytes,
  type TlsMaterial,
  type TlsTestDirs,
  tlsMaterialOf,
  writeSecretVolume,
} from "@airm/rm-core";
import { afterAll, beforeAll, describe, expect, test, vi } from "vitest";
import { RelayClient, frame, spawnRelay, startRelay, type RelayProcess } from "../src/index.ts";

const { HEADER_BYTES, Op, Status, decodeHeader, encodeHead } = frame;
const TOKEN = newInternalToken();

let root: string;
let dirs: TlsTestDirs;
let material: TlsMaterial;
let relay: RelayProcess;

beforeAll(async () => {
  root = mkdtempSync(join(tmpdir(), "airm-relay-tls-"));
  dirs = makeTlsTestDirs(root);
  material = loadTlsDir(dirs.good);
  relay = await spawnRelay(["--listen", "127.0.0.1:0", "--metrics-port", "0"], { AIRM_TLS_DIR: dirs.good, AIRM_INTERNAL_TOKEN: TOKEN });
});
afterAll(async () => {
  await relay?.stop();
  if (root) rmSync(root, { recursive: true, force: true });
});

function hello(): Buffer {
  const payload = Buffer.from(TOKEN, "utf8");
  return Buffer.concat([encodeHead({ op: Op.HELLO, flags: 0, status: 0, tag: 7, payloadLength: payload.length, crc: 0, arg: 0 }), payload]);
}

/**
 * Opens a TLS connection presenting the certificate of TLS folder `client` (none: no certificate),
 * trusting the deployment's CA, sends a HELLO with the right token and collects what comes back
 * until the connection closes: the bytes, and the error, if any.
 */
async function helloOverTls(client?: string): Promise<{ answer: Buffer; error?: string }> {
  const own = client ? { cert: readFileSync(join(client, "tls.crt")), key: readFileSync(join(client, "tls.key")) } : {};
  const s = tls.connect({ host: "127.0.0.1", port: relay.port, ca: material.ca, ...own, checkServerIdentity: () => undefined });
  const chunks: Buffer[] = [];
  let error: string | undefined;
  s.on("data", (d: Buffer) => {
    chunks.push(d);
    if (Buffer.concat(chunks).length >= HEADER_BYTES) s.end();
  });
  s.on("error", (e: NodeJS.ErrnoException) => (error = e.code ?? e.message));
  s.once("secureConnect", () => s.write(hello()));
  const timer = setTimeout(() => s.destroy(), 5000);
  await new Promise((r) => s.once("close", r)); // (events.once would reject on the error)
  clearTimeout(timer);
  return { answer: Buffer.concat(chunks), ...(error ? { error } : {}) };
}

/** The value of airm_kv_relay_frames_rejected_total for `reason` (0 when absent). */
async function rejected(reason: string): Promise<number> {
  const mport = Number(/metrics on port (\d+)/.exec(relay.stdout())![1]);
  const text = await (await fetch(`http://127.0.0.1:${mport}/metrics`)).text();
  const m = new RegExp(`^airm_kv_relay_frames_rejected_total\\{reason="${reason}"\\} (\\d+)$`, "m").exec(text);
  return m ? Number(m[1]) : 0;
}

describe("airm-kv-relay with AIRM_TLS_DIR", () => {
  test("says it serves mutual TLS", () => {
    expect(relay.stdout()).toMatch(/listening on 127\.0\.0\.1:\d+ \(mutual TLS, metrics on port \d+\)/);
  });

  test("moves blobs of every size to a client with the deployment's certificate, each CRC-checked", async () => {
    const c = RelayClient.connect(relay.address, { token: TOKEN, tls: material });
    try {
      const sizes = [1, 100, 65_535, 65_536, 65_537, 262_143, 262_145, 1 << 20, (4 << 20) + 7];
      await Promise.all(sizes.map((n, i) => c.push(`tls-${i}/0/k`, patternBytes(i + 1, n))));
      for (const [i, n] of sizes.entries()) {
        const into = new Uint8Array(n + 5);
        const got = await c.pull(`tls-${i}/0/k`, { into });
        expect(Buffer.from(got.bytes).equals(patternBytes(i + 1, n)), `blob of ${n} bytes`).toBe(true);
        expect(got.crc32).toBe(kvCrc32(patternBytes(i + 1, n)));
      }
      await Promise.all(sizes.map((_, i) => c.release(`tls-${i}`)));
    } finally {
      c.close();
    }
  });

  test("answers a HELLO from a client with the deployment's certificate (the control of the refusals below)", async () => {
    const r = await helloOverTls(dirs.good);
    expect(r.error).toBeUndefined();
    expect(decodeHeader(r.answer).status).toBe(Status.OK);
  });

  // TLS 1.3: the client's side of the handshake ends before the relay checks its certificate;
  // the relay then sends an alert (no certificate) or closes the connection (a refused one).
  test.each([
    ["no certificate", undefined, "ERR_SSL_TLSV13_ALERT_CERTIFICATE_REQUIRED", "ERR_SSL_PEER_DID_NOT_RETURN_A_CERTIFICATE"],
    ["a certificate of another CA", "foreign", undefined, "UNABLE_TO_VERIFY_LEAF_SIGNATURE"],
    ["an expired certificate", "expired", undefined, "CERT_HAS_EXPIRED"],
  ] as const)("refuses a caller with %s at the handshake", async (_what, client, error, reason) => {
    const before = await rejected("tls_handshake");
    const r = await helloOverTls(client && dirs[client]);
    expect(r.answer.length).toBe(0); // the HELLO was never answered: the connection ended in the handshake
    expect(r.error).toBe(error);
    // The relay counts and logs it as the connection closes on its side (a moment after this one).
    for (let i = 0; i < 50 && (await rejected("tls_handshake")) === before; i++) await new Promise((res) => setTimeout(res, 100));
    expect(await rejected("tls_handshake")).toBe(before + 1);
    expect(relay.stderr()).toContain(`refused: ${reason}`);
  });

  test("a client refuses a relay whose certificate the deployment's CA did not issue", async () => {
    const foreign = dirs.foreign;
    const impostorTls = new LiveTlsMaterial(foreign, {
      cert: readFileSync(join(foreign, "tls.crt")),
      key: readFileSync(join(foreign, "tls.key")),
      ca: readFileSync(join(root, "other-ca", "ca.crt")),
    });
    const impostor = await startRelay({ host: "127.0.0.1", port: 0, tls: impostorTls, token: TOKEN });
    const c = RelayClient.connect(impostor.address, { token: TOKEN, tls: material });
    try {
      const e = await c.pull("impostor/0/k", { timeoutMs: 1000 }).then(
        () => null,
        (err: Error) => err,
      );
      expect(e?.message).toContain("(self-signed certificate in certificate chain) (TLS: ");
      expect(e?.message).toContain("AIRM_TLS_DIR");
    } finally {
      c.close();
      await impostor.close();
    }
  });

  test("gives nothing to a plain TCP client", async () => {
    const c = RelayClient.connect(relay.address, { token: TOKEN });
    try {
      const e = await c.pull("plain/0/k", { timeoutMs: 1000 }).then(
        () => null,
        (err: Error) => err,
      );
      expect(e?.message).toMatch(/closed before it answered/);
    } finally {
      c.close();
    }
  });
});

test("a client whose TLS folder was renewed (another CA's files) reaches a relay restarted with them: its new connections use the new files", async () => {
  const ca1 = createCa(join(root, "renew-ca1"), "first CA");
  const ca2 = createCa(join(root, "renew-ca2"), "second CA");
  const volume = join(root, "renew-client");
  writeSecretVolume(volume, issueLeaf(ca1, join(root, "renew-client-1")));
  const client = tlsMaterialOf(volume, { reloadS: 0.05 })!;
  const first = await startRelay({ host: "127.0.0.1", port: 0, tls: loadTlsDir(issueLeaf(ca1, join(root, "renew-relay-1"))), token: TOKEN });
  const port = Number(first.address.split(":").pop());
  const c = RelayClient.connect(first.address, { token: TOKEN, tls: client });
  let second: Awaited<ReturnType<typeof startRelay>> | undefined;
  try {
    await c.push("renew-1/0/k", patternBytes(1, 1000));
    expect(Buffer.from((await c.pull("renew-1/0/k")).bytes).equals(patternBytes(1, 1000))).toBe(true);

    writeSecretVolume(volume, issueLeaf(ca2, join(root, "renew-client-2")));
    await vi.waitFor(() => expect(client.generation).toBe(1), { timeout: 5000 });
    await first.close();
    second = await startRelay({ host: "127.0.0.1", port, tls: loadTlsDir(issueLeaf(ca2, join(root, "renew-relay-2"))), token: TOKEN });
    await c.push("renew-2/0/k", patternBytes(2, 1000), { timeoutMs: 5000 });
    expect(Buffer.from((await c.pull("renew-2/0/k")).bytes).equals(patternBytes(2, 1000))).toBe(true);
  } finally {
    c.close();
    await first.close().catch(() => {});
    await second?.close();
  }
});
