// Mutual TLS between the parts (AIRM_TLS_DIR), with real processes and certificates made by
// openssl: a PD cluster started with the launcher's throwaway CA (airm up --tls) gives exactly the
// tokens of a plain solo worker, through the workers' internal API and through the gateway (which
// reaches its workers over TLS), with its KV through a TLS relay; its TLS folder is gone once it
// stops; the real `airm up --tls` does the same. A worker given a TLS folder refuses at the handshake a caller with no certificate, one of
// another CA and an expired one (and says why in its log); a part whose folder lacks a file does
// not start and names it.

import { spawnSync } from "node:child_process";
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { request } from "node:https";
import { connect as tlsConnect } from "node:tls";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import type { PrefillRequest } from "@airm/internal-api";
import { createCa, issueLeaf, makeTlsTestDirs, type TlsTestDirs, writeSecretVolume } from "@airm/rm-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { RunningCluster } from "../../src/index.ts";
import { freePort } from "../../src/index.ts";
import { startAirmUp, waitFor } from "../helpers/airm-up.ts";
import { cluster, modelId, pdTokens, postJson, soloTokens, tinyModel, until } from "../helpers/cluster.ts";

const S = 128;
let model: string;
let plain: RunningCluster;
let certs: string;
let dirs: TlsTestDirs;

beforeAll(async () => {
  model = tinyModel({ arch: "qwen2" });
  certs = mkdtempSync(join(tmpdir(), "airm-tls-e2e-"));
  dirs = makeTlsTestDirs(certs);
  plain = await cluster({ mode: "solo", model, maxModelLen: S, gateway: false });
});
afterAll(async () => {
  await plain?.stop();
  if (model) rmSync(model, { recursive: true, force: true });
  if (certs) rmSync(certs, { recursive: true, force: true });
});

/** GET `path` over TLS presenting the certificate of TLS folder `client` (none: no certificate), trusting `ca`: the status, or the error when no answer came. */
function tlsGet(url: string, path: string, ca: Buffer, client?: string): Promise<{ status?: number; error?: string }> {
  const own = client ? { cert: readFileSync(join(client, "tls.crt")), key: readFileSync(join(client, "tls.key")) } : {};
  const u = new URL(url);
  return new Promise((resolve) => {
    const req = request({ host: u.hostname, port: u.port, path, ca, ...own, agent: false, checkServerIdentity: () => undefined }, (r) => {
      r.resume();
      r.on("end", () => resolve({ status: r.statusCode }));
    });
    req.on("error", (e: NodeJS.ErrnoException) => resolve({ error: e.code ?? e.message }));
    req.end();
  });
}

describe("PD over tcp with airm up --tls (a throwaway CA)", () => {
  let pd: RunningCluster;
  beforeAll(async () => {
    pd = await cluster({ model, maxModelLen: S, kvTransport: "tcp", tls: true, decode: [{ backend: "atom" }] });
  });
  afterAll(async () => {
    await pd?.stop();
  });

  it("gives exactly the plain solo worker's tokens, workers and gateway alike", async () => {
    const tls = pd.tls!;
    expect(tls).not.toBeNull();
    expect(pd.part("prefill").url).toMatch(/^https:\/\//);
    expect(pd.part("decode").url).toMatch(/^https:\/\//);
    expect(pd.part("kv-relay").logs()).toContain("(mutual TLS)");
    const bodies: Omit<PrefillRequest, "requestId">[] = [
      { input: { prompt: "over an encrypted wire" }, maxTokens: 10, sampling: { temperature: 0 } },
      { input: { promptTokenIds: Array.from({ length: S - 10 }, (_, i) => 3 + ((i * 13) % 400)) }, maxTokens: 10, sampling: { temperature: 0 } },
      { input: { prompt: "seeded sampling" }, maxTokens: 10, sampling: { temperature: 0.8, seed: 99 } },
    ];
    for (const [i, body] of bodies.entries()) {
      const want = await soloTokens(plain.part("solo").url, { requestId: `s-${i}`, ...body }, plain.internalToken);
      const got = await pdTokens(pd.part("prefill").url, pd.part("decode").url, { requestId: `p-${i}`, ...body }, pd.internalToken, tls);
      expect(got).toEqual(want);
    }
    // The gateway's client port is plain HTTP; it reaches the workers over TLS.
    const r = await postJson(`${pd.url}/v1/completions`, { model: await modelId(pd), prompt: "over an encrypted wire", max_tokens: 10, temperature: 0 });
    expect(r.status).toBe(200);
    const want = await soloTokens(plain.part("solo").url, { requestId: "s-gw", ...bodies[0] }, plain.internalToken);
    expect(r.body.choices[0].text).toBe(want.text);
  });

  it("serves no plain HTTP on a worker's port", async () => {
    const plainUrl = pd.part("decode").url.replace("https://", "http://");
    const r = await fetch(`${plainUrl}/health`, { signal: AbortSignal.timeout(5000) }).then(
      (x) => `status ${x.status}`,
      (e: Error) => e.message,
    );
    expect(r).toBe("fetch failed");
  });

  it("removes the throwaway CA's folder when the cluster stops", async () => {
    const dir = pd.tls!.dir;
    expect(existsSync(join(dir, "tls.key"))).toBe(true);
    expect(existsSync(join(dir, "..", "ca.key"))).toBe(false);
    await pd.stop();
    expect(existsSync(dir)).toBe(false);
  });
});

describe("a worker given AIRM_TLS_DIR", () => {
  let solo: RunningCluster;
  let ca: Buffer;
  beforeAll(async () => {
    ca = readFileSync(join(dirs.good, "ca.crt"));
    solo = await cluster({ mode: "solo", model, maxModelLen: S, gateway: false, env: { AIRM_TLS_DIR: dirs.good } });
  });
  afterAll(async () => {
    await solo?.stop();
  });

  it("uses that folder (the launcher's probes and callers present its certificate)", async () => {
    expect(solo.tls?.dir).toBe(dirs.good);
    expect(await tlsGet(solo.part("solo").url, "/health", ca, dirs.good)).toEqual({ status: 200 });
    const run = await soloTokens(
      solo.part("solo").url,
      { requestId: "t-1", input: { prompt: "hello" }, maxTokens: 4, sampling: { temperature: 0 } },
      solo.internalToken,
      solo.tls!,
    );
    expect(run.tokens.length).toBeGreaterThan(0);
  });

  it.each([
    ["no certificate", undefined, "ERR_SSL_TLSV13_ALERT_CERTIFICATE_REQUIRED", "ERR_SSL_PEER_DID_NOT_RETURN_A_CERTIFICATE"],
    ["a certificate of another CA", "foreign", "ECONNRESET", "UNABLE_TO_VERIFY_LEAF_SIGNATURE"],
    ["an expired certificate", "expired", "ECONNRESET", "CERT_HAS_EXPIRED"],
  ] as const)("refuses a caller with %s at the handshake", async (_what, client, clientError, reason) => {
    const worker = solo.part("solo");
    const r = await tlsGet(worker.url, "/health", ca, client && dirs[client]);
    // No HTTP answer at all (not a 401): the TLS handshake failed.
    expect(r).toEqual({ error: clientError });
    await until(() => worker.logs(400).includes(`TLS handshake refused: ${reason}`), `the worker to log ${reason}`, 10_000);
  });
});

/**
 * A TLS handshake with `hostPort` presenting folder `client`'s certificate and trusting its
 * ca.crt: the server certificate's CN once the server took the caller (the connection stays open
 * 1.5 s after the handshake, as a worker waits for a request and the relay for a HELLO frame), else
 * "refused" (TLS 1.3: a server refuses a client certificate after the client's handshake ended).
 */
function serverCn(hostPort: string, client: string): Promise<string> {
  const [host, port] = [hostPort.slice(0, hostPort.lastIndexOf(":")), Number(hostPort.slice(hostPort.lastIndexOf(":") + 1))];
  const file = (f: string) => readFileSync(join(client, f));
  return new Promise((resolve) => {
    let cn = "";
    const done = (answer: string) => {
      resolve(answer);
      s.destroy();
    };
    const s = tlsConnect({ host, port, cert: file("tls.crt"), key: file("tls.key"), ca: file("ca.crt"), checkServerIdentity: () => undefined }, () => {
      cn = String(s.getPeerCertificate().subject.CN);
      setTimeout(() => done(cn), 1500);
    });
    s.on("error", () => done("refused"));
    s.on("close", () => done("refused"));
  });
}

describe("certificates renewed in place (AIRM_TLS_RELOAD_S): the CA of a running PD cluster changes", () => {
  let pd: RunningCluster;
  let volume: string;
  let caller1: string;
  let caller2: string;
  let next: string;
  beforeAll(async () => {
    const ca1 = createCa(join(certs, "renew-ca1"), "first CA");
    const ca2 = createCa(join(certs, "renew-ca2"), "second CA");
    caller1 = issueLeaf(ca1, join(certs, "renew-caller1"), { cn: "caller of the first CA" });
    caller2 = issueLeaf(ca2, join(certs, "renew-caller2"), { cn: "caller of the second CA" });
    next = issueLeaf(ca2, join(certs, "renew-next"), { cn: "parts of the second CA" });
    volume = join(certs, "renew-volume");
    writeSecretVolume(volume, issueLeaf(ca1, join(certs, "renew-first"), { cn: "parts of the first CA" }));
    pd = await cluster({
      model,
      maxModelLen: S,
      kvTransport: "tcp",
      decode: [{ backend: "atom" }],
      onPartExit: "restart",
      env: { AIRM_TLS_DIR: volume, AIRM_TLS_RELOAD_S: "0.3", AIRM_LOG_LEVEL: "info" },
    });
  });
  afterAll(async () => {
    await pd?.stop();
  });

  it("the workers and the relay serve the new certificate and refuse the old CA, and the gateway reaches a restarted worker with it", async () => {
    const id = await modelId(pd);
    const ask = () => postJson(`${pd.url}/v1/completions`, { model: id, prompt: "renewed in place", max_tokens: 8, temperature: 0 });
    const before = await ask();
    expect(before.status, JSON.stringify(before.body)).toBe(200);
    const addr = (name: string) => pd.part(name).url.replace(/^\w+:\/\//, "");
    const servers = [addr("prefill"), addr("decode"), addr("kv-relay")];
    for (const a of servers) expect(await serverCn(a, caller1), a).toBe("parts of the first CA");

    writeSecretVolume(volume, next); // as the kubelet swaps a renewed Secret's files
    for (const a of servers) await until(async () => (await serverCn(a, caller2)) === "parts of the second CA", `${a} to serve the new certificate`, 20_000, 200);
    for (const a of servers) expect(await serverCn(a, caller1), a).toBe("refused");
    for (const name of ["prefill", "decode", "kv-relay"]) expect(pd.part(name).logs(), name).toContain("TLS certificates reloaded");

    // A decode worker restarted now starts with the new files: the gateway's connections to it are
    // new ones, which work only if the gateway presents the new certificate too.
    const restarted = pd.part("decode");
    restarted.child.kill("SIGKILL");
    await restarted.exited;
    await until(async () => (await ask()).status === 200, "a completion through the restarted decode worker", 90_000, 500);
    const after = await ask();
    expect(after.status, JSON.stringify(after.body)).toBe(200);
    expect(after.body.choices[0].text).toBe(before.body.choices[0].text);
  }, 240_000);
});

describe("a part whose AIRM_TLS_DIR lacks a file", () => {
  it("does not start and names the file", () => {
    const dir = join(certs, "partial");
    mkdirSync(dir);
    for (const f of ["tls.crt", "ca.crt"]) copyFileSync(join(dirs.good, f), join(dir, f));
    const bin = fileURLToPath(new URL("../../../worker/bin/airm-worker.mjs", import.meta.url));
    const r = spawnSync(process.execPath, [bin, "--role", "solo", "--backend", "rngd", "--model", model, "--port", "0"], {
      env: { ...process.env, AIRM_TLS_DIR: dir },
      encoding: "utf8",
      timeout: 60_000,
    });
    expect(r.status).toBe(1);
    expect(r.stderr).toContain(`AIRM_TLS_DIR: ${join(dir, "tls.key")} is missing`);
  });
});

describe("airm up --tls (the real command)", () => {
  it("is in --help", () => {
    const bin = fileURLToPath(new URL("../../bin/airm.mjs", import.meta.url));
    const help = spawnSync(process.execPath, [bin, "up", "--help"], { encoding: "utf8" }).stdout;
    expect(help).toMatch(/--tls\s+mutual TLS between the parts/);
  });

  it("serves over a cluster whose parts talk mutual TLS, and removes its TLS folder on SIGTERM", async () => {
    const [port, pp, dp, sp] = [await freePort(), await freePort(), await freePort(), await freePort()];
    const args = ["--model", model, "--kv-transport", "tcp", "--tls", "--decode-replicas", "1", "--quiet"];
    const up = startAirmUp([...args, "--port", String(port), "--prefill-port", String(pp), "--decode-port", String(dp), "--sidecar-port", String(sp)]);
    try {
      await waitFor(() => up.out().includes("rngd-pd is up") || up.child.exitCode !== null, 150_000, "airm up to be ready");
      const dir = /mutual TLS between the parts, (\S+)\)/.exec(up.out())?.[1];
      expect(dir, up.err()).toBeDefined();
      expect(existsSync(join(dir!, "tls.crt"))).toBe(true);
      const base = `http://127.0.0.1:${port}`;
      const id = ((await (await fetch(`${base}/v1/models`)).json()) as { data: { id: string }[] }).data[0].id;
      const r = await postJson(`${base}/v1/completions`, { model: id, prompt: "Hello there", max_tokens: 6, temperature: 0 });
      expect(r.status, JSON.stringify(r.body)).toBe(200);
      expect(r.body.usage.completion_tokens).toBeGreaterThan(0);
      up.child.kill("SIGTERM");
      expect(await up.exit).toBe(0);
      expect(existsSync(dir!)).toBe(false);
    } catch (e) {
      console.error(`airm up stdout:\n${up.out()}\nairm up stderr:\n${up.err()}`);
      throw e;
    } finally {
      up.kill();
    }
  });
});
