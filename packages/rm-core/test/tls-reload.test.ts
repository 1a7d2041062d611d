// A part's TLS folder renewed in place (AIRM_TLS_RELOAD_S), with real certificates made by openssl
// and the folder updated as the kubelet updates a mounted Secret (writeSecretVolume): reload()
// takes new files that pass the start checks and tells its listeners, keeps the old ones when the
// new fail (the error names the file), and watch() reports a bad set once it stayed for two reads.
// A real TLS server following the reloads presents the new certificate and trusts the new CA on
// the handshakes after.

import { copyFileSync, mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { connect, createServer, type Server } from "node:tls";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { type CaFiles, ConfigError, createCa, issueLeaf, loadTlsDir, serveReloads, serverTlsOptions, tlsMaterialOf, writeSecretVolume } from "../src/index.ts";

let root: string;
let ca1: CaFiles;
let ca2: CaFiles;

beforeAll(() => {
  root = mkdtempSync(join(tmpdir(), "airm-tls-reload-"));
  ca1 = createCa(join(root, "ca1"), "first CA");
  ca2 = createCa(join(root, "ca2"), "second CA");
});
afterAll(() => rmSync(root, { recursive: true, force: true }));

let n = 0;
/** A new leaf of `ca` in a folder of its own (CN `cn`). */
function leaf(ca: CaFiles, cn: string, o: { expired?: boolean } = {}): string {
  const dir = join(root, `leaf-${n++}`);
  return issueLeaf(ca, dir, { cn, ...(o.expired ? { notBefore: new Date(Date.UTC(2020, 0, 1)), notAfter: new Date(Date.UTC(2020, 0, 2)) } : {}) });
}

/** A Secret volume holding `from`'s files. */
function volume(from: string): string {
  const dir = join(root, `volume-${n++}`);
  writeSecretVolume(dir, from);
  return dir;
}

const until = async (ok: () => boolean, what: string, ms = 5000) => {
  const end = Date.now() + ms;
  while (!ok()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
};

describe("reloading a TLS folder", () => {
  test("new files that pass the checks replace the old, and the listeners are told; unchanged files are 'same'", () => {
    const dir = volume(leaf(ca1, "first"));
    const m = loadTlsDir(dir);
    const before = m.cert;
    let told = 0;
    m.onReload(() => told++);
    expect(m.reload()).toBe("same");
    expect([m.generation, told]).toEqual([0, 0]);
    const renewed = leaf(ca1, "renewed");
    writeSecretVolume(dir, renewed);
    expect(m.reload()).toBe("reloaded");
    expect([m.generation, told]).toEqual([1, 1]);
    expect(m.cert.equals(before)).toBe(false);
    expect(m.cert.equals(loadTlsDir(renewed).cert)).toBe(true);
    expect(m.reload()).toBe("same");
  });

  test.each([
    ["an expired certificate", (dir: string) => writeSecretVolume(dir, leaf(ca1, "old", { expired: true })), /tls\.crt expired on/],
    ["another CA's certificate with the old ca.crt", (dir: string) => writeSecretVolume(dir, mixed(leaf(ca2, "other"), dir)), /was not issued by a certificate of/],
  ])("new files with %s are refused and the old stay in force", (_what, change, why) => {
    const dir = volume(leaf(ca1, "kept"));
    const m = loadTlsDir(dir);
    const before = m.cert;
    let told = 0;
    m.onReload(() => told++);
    change(dir);
    let err: unknown;
    try {
      m.reload();
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(ConfigError);
    expect((err as Error).message).toMatch(why);
    expect([m.cert.equals(before), m.generation, told]).toEqual([true, 0, 0]);
  });

  test("watch() reports a bad set once, after two reads, and takes the good set that follows", async () => {
    const dir = volume(leaf(ca1, "watched"));
    const m = loadTlsDir(dir);
    const errors: string[] = [];
    const stop = m.watch(30, (e) => errors.push(e.message));
    try {
      writeSecretVolume(dir, leaf(ca1, "expired", { expired: true }));
      await until(() => errors.length > 0, "the bad set reported");
      await new Promise((r) => setTimeout(r, 200));
      expect(errors).toHaveLength(1);
      expect(m.generation).toBe(0);
      writeSecretVolume(dir, leaf(ca1, "fixed"));
      await until(() => m.generation === 1, "the good set taken");
    } finally {
      stop();
    }
  });
});

/** A folder with `leafDir`'s certificate and key and `caFrom`'s ca.crt. */
function mixed(leafDir: string, caFrom: string): string {
  const out = join(root, `mixed-${n++}`);
  mkdirSync(out);
  for (const f of ["tls.crt", "tls.key"]) copyFileSync(join(leafDir, f), join(out, f));
  copyFileSync(join(caFrom, "ca.crt"), join(out, "ca.crt"));
  return out;
}

describe("a TLS server following the reloads (serveReloads)", () => {
  let server: Server;
  afterAll(() => server?.close());

  /**
   * Connects presenting the certificate of folder `client` and trusting `caOf`'s ca.crt: the
   * server certificate's CN when the server took the caller (it writes "ok"), else "refused".
   */
  function handshake(port: number, client: string, caOf: string): Promise<string> {
    const c = loadTlsDir(client);
    return new Promise((resolve) => {
      let cn = "";
      let got = "";
      const s = connect({ port, host: "127.0.0.1", cert: c.cert, key: c.key, ca: loadTlsDir(caOf).ca, checkServerIdentity: () => undefined }, () => {
        cn = String(s.getPeerCertificate().subject.CN);
      });
      s.on("data", (d) => (got += d));
      s.on("error", () => {});
      s.on("close", () => resolve(got === "ok" ? cn : "refused"));
    });
  }

  test("presents the renewed certificate, and after a CA change trusts callers of the new CA only", async () => {
    const first = leaf(ca1, "server-1");
    const dir = volume(first);
    const m = tlsMaterialOf(dir, { reloadS: 0.05 })!;
    server = createServer(serverTlsOptions(m), (s) => s.end("ok"));
    serveReloads(server, m);
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    const port = (server.address() as { port: number }).port;
    const caller1 = leaf(ca1, "caller-1");
    const caller2 = leaf(ca2, "caller-2");
    expect(await handshake(port, caller1, first)).toBe("server-1");
    expect(await handshake(port, caller2, first)).toBe("refused"); // the second CA is not trusted yet

    writeSecretVolume(dir, leaf(ca1, "server-renewed"));
    await until(() => m.generation === 1, "the renewal read");
    expect(await handshake(port, caller1, first)).toBe("server-renewed");

    const second = leaf(ca2, "server-2");
    writeSecretVolume(dir, second);
    await until(() => m.generation === 2, "the new CA read");
    expect(await handshake(port, caller2, second)).toBe("server-2");
    expect(await handshake(port, caller1, second)).toBe("refused"); // the first CA is no longer trusted
  });
});
