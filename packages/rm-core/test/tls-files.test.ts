// The TLS folder (AIRM_TLS_DIR) a part loads at start, with real certificates made by openssl
// (tls-certs.ts): a good folder loads; each fault stops the part with a ConfigError naming the
// file at fault (missing, not PEM, expired, a key of another certificate, another CA's).

import { copyFileSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { ConfigError, loadTlsDir, makeTlsDir, makeTlsTestDirs, TLS_FILES, type TlsTestDirs } from "../src/index.ts";

let root: string;
let dirs: TlsTestDirs;

beforeAll(() => {
  root = mkdtempSync(join(tmpdir(), "airm-tls-files-"));
  dirs = makeTlsTestDirs(root);
});
afterAll(() => rmSync(root, { recursive: true, force: true }));

/** A copy of the good folder in a new one, with `change` applied. */
function variant(name: string, change: (dir: string) => void): string {
  const dir = join(root, name);
  mkdirSync(dir);
  for (const f of Object.values(TLS_FILES)) copyFileSync(join(dirs.good, f), join(dir, f));
  change(dir);
  return dir;
}

function configError(dir: string): ConfigError {
  try {
    loadTlsDir(dir);
  } catch (e) {
    expect(e).toBeInstanceOf(ConfigError);
    return e as ConfigError;
  }
  throw new Error(`${dir} loaded`);
}

describe("loadTlsDir", () => {
  test("loads a folder of the cert-manager layout", () => {
    const m = loadTlsDir(dirs.good);
    expect(m.dir).toBe(dirs.good);
    expect(m.cert.toString()).toContain("BEGIN CERTIFICATE");
    expect(m.key.toString()).toContain("PRIVATE KEY");
  });

  test("airm up's folder: one leaf of a throwaway CA whose key is gone", () => {
    const m = loadTlsDir(makeTlsDir(join(root, "up")));
    expect(m.ca.toString()).toContain("BEGIN CERTIFICATE");
  });

  test.each(Object.values(TLS_FILES))("a missing %s is named", (file) => {
    const dir = variant(`missing-${file}`, (d) => rmSync(join(d, file)));
    expect(configError(dir).message).toBe(`AIRM_TLS_DIR: ${join(dir, file)} is missing; the folder must hold tls.crt, tls.key, ca.crt (a cert-manager Secret mounted as a volume)`);
  });

  test("a folder that does not exist", () => {
    expect(configError(join(root, "nowhere")).message).toContain(`${join(root, "nowhere")} is not a folder`);
  });

  test("a file that is not PEM", () => {
    const dir = variant("not-pem", (d) => writeFileSync(join(d, TLS_FILES.cert), "hello"));
    expect(configError(dir).message).toContain(`${join(dir, "tls.crt")} is not PEM`);
  });

  test("an expired certificate", () => {
    expect(configError(dirs.expired).message).toMatch(/tls\.crt expired on Jan {2}2 00:00:00 2020 GMT/);
  });

  test("a key that is not the certificate's", () => {
    const dir = variant("other-key", (d) => copyFileSync(join(dirs.foreign, TLS_FILES.key), join(d, TLS_FILES.key)));
    expect(configError(dir).message).toContain(`${join(dir, "tls.key")} is not the key of ${join(dir, "tls.crt")}`);
  });

  test("a certificate another CA issued", () => {
    // dirs.foreign: another CA's leaf beside the deployment's ca.crt.
    expect(configError(dirs.foreign).message).toContain("was not issued by a certificate of");
  });
});
