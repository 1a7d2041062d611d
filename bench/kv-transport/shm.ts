// pnpm bench kv-transport --transport shm [--reps N] [--warmup N]
// One 67.1 MB request (64 x 1 MiB blobs) through the shm transport: this process pushes (timed),
// a separate consumer process pulls (timed) twice - as zero-copy views, and `into` a pre-touched
// destination of its own (a real copy) - then releases. The reference is a memcpy of the same
// 64 MiB into an already-touched buffer, measured in this process in the same run. Final line:
// {"bench":"kv-transport","transport":"shm","push_ms","pull_ms","pull_copy_ms","memcpy_ms","ratio","ratio_copy"}.
// pull_ms is the transport's pull as its contract defines it (zero-copy views, valid until
// release); pull_copy_ms adds a copy into the consumer's own buffer (`into`), reported beside it.

import { spawn, type ChildProcess } from "node:child_process";
import { once } from "node:events";
import { rmSync } from "node:fs";
import { fileURLToPath, pathToFileURL } from "node:url";
import { flagOf, int, text } from "../../packages/rm-core/src/index.ts";
import { benchArgs, finalLine, fmt, progress, progressDone, summarize } from "../lib.ts";

const BLOBS = 64;
const BLOB_BYTES = 1 << 20;
const REQUEST_BYTES = BLOBS * BLOB_BYTES;
const self = fileURLToPath(import.meta.url);

const keyOf = (rid: string, i: number): string => `${rid}/${i >> 1}/${i & 1 ? "v" : "k"}`;

type ToConsumer = { op: "pull"; rid: string; verify: boolean } | { op: "exit" };
type FromConsumer = { ready: true } | { viewMs: number; intoMs: number; verified: boolean } | { error: string };

// ---------------------------------------------------------------------------------------------
// The consumer process: pulls each request it is told about, as views and into its own buffer.

async function consumer(root: string): Promise<void> {
  const { shmTransport } = await import("../../packages/kv-shm/src/index.ts");
  const { patternBytes } = await import("../../packages/rm-core/src/index.ts");
  const { SHM_CONFIG } = await import("../../packages/kv-shm/src/index.ts");
  const t = (await shmTransport.create(SHM_CONFIG.resolve({ options: { root } }))) as import("../../packages/rm-core/src/index.ts").KVTransport;
  const dest = new Uint8Array(REQUEST_BYTES).fill(1); // the decode worker's KV buffer, already touched
  const intos = Array.from({ length: BLOBS }, (_, i) => dest.subarray(i * BLOB_BYTES, (i + 1) * BLOB_BYTES));
  let expected: Uint8Array[] | undefined;
  const send = (m: FromConsumer): void => void process.send!(m);
  process.on("message", async (m: ToConsumer) => {
    try {
      if (m.op === "exit") {
        await t.close();
        process.disconnect();
        return;
      }
      const views: Uint8Array[] = new Array(BLOBS);
      let t0 = performance.now();
      for (let i = 0; i < BLOBS; i++) views[i] = (await t.pull(keyOf(m.rid, i), { timeoutMs: 30_000 })).bytes;
      const viewMs = performance.now() - t0;
      t0 = performance.now();
      for (let i = 0; i < BLOBS; i++) await t.pull(keyOf(m.rid, i), { timeoutMs: 30_000, into: intos[i] });
      const intoMs = performance.now() - t0;
      let verified = false;
      if (m.verify) {
        expected ??= Array.from({ length: BLOBS }, (_, i) => patternBytes(i + 1, BLOB_BYTES));
        for (let i = 0; i < BLOBS; i++) {
          const v = views[i];
          if (!Buffer.from(v.buffer, v.byteOffset, v.byteLength).equals(expected[i])) throw new Error(`blob ${i} (view) differs`);
          if (!Buffer.from(intos[i].buffer, intos[i].byteOffset, BLOB_BYTES).equals(expected[i])) throw new Error(`blob ${i} (into) differs`);
        }
        verified = true;
      }
      await t.release(m.rid);
      send({ viewMs, intoMs, verified });
    } catch (e) {
      send({ error: e instanceof Error ? e.message : String(e) });
    }
  });
  send({ ready: true });
}

// ---------------------------------------------------------------------------------------------
// The driver (producer + reference).

function nextMessage(child: ChildProcess): Promise<FromConsumer> {
  return new Promise((resolve, reject) => {
    const onMessage = (m: FromConsumer): void => {
      child.off("exit", onExit);
      if ("error" in m) reject(new Error(`consumer: ${m.error}`));
      else resolve(m);
    };
    const onExit = (code: number | null): void => {
      child.off("message", onMessage);
      reject(new Error(`consumer exited (${code}) before answering`));
    };
    child.once("message", onMessage);
    child.once("exit", onExit);
  });
}

/** Runs the bench; `argv` as given to `pnpm bench kv-transport` (--reps, --warmup). */
export async function run(argv: string[]): Promise<void> {
  const { reps, warmup } = benchArgs(
    "kv-transport",
    "one 67.1 MB request through the shm transport against a memcpy",
    {
      transport: flagOf(text({ label: "name" }), { default: "shm", doc: "the transport" }),
      reps: flagOf(int({ min: 1 }), { default: 15, doc: "measured repetitions" }),
      warmup: flagOf(int({ min: 0 }), { default: 3, doc: "unmeasured repetitions first" }),
    },
    argv,
  );
  const { shmTransport, SHM_CONFIG } = await import("../../packages/kv-shm/src/index.ts");
  const { patternBytes } = await import("../../packages/rm-core/src/index.ts");
  const root = `${SHM_CONFIG.resolve({}).root}-bench-${process.pid}`;
  const blobs = Array.from({ length: BLOBS }, (_, i) => patternBytes(i + 1, BLOB_BYTES));
  const refDest = new Uint8Array(REQUEST_BYTES).fill(1);
  const producer = (await shmTransport.create(SHM_CONFIG.resolve({ options: { root } }))) as import("../../packages/rm-core/src/index.ts").KVTransport;
  const child = spawn(process.execPath, ["--import", "tsx", self, "--consumer", root], { stdio: ["ignore", "inherit", "inherit", "ipc"] });
  try {
    const hello = await nextMessage(child);
    if (!("ready" in hello)) throw new Error("consumer did not start");
    const push: number[] = [];
    const pull: number[] = [];
    const view: number[] = [];
    const memcpy: number[] = [];
    for (let r = 0; r < warmup + reps; r++) {
      progress(`shm rep ${r + 1}/${warmup + reps}`);
      let t0 = performance.now();
      for (let i = 0; i < BLOBS; i++) refDest.set(blobs[i], i * BLOB_BYTES);
      const memcpyMs = performance.now() - t0;
      const rid = `bench-${r}`;
      t0 = performance.now();
      for (let i = 0; i < BLOBS; i++) await producer.push(keyOf(rid, i), blobs[i]);
      const pushMs = performance.now() - t0;
      child.send({ op: "pull", rid, verify: r < warmup } satisfies ToConsumer);
      const got = await nextMessage(child);
      if (!("viewMs" in got)) throw new Error("unexpected consumer answer");
      if (r < warmup) {
        if (!got.verified) throw new Error("consumer did not verify the warm-up bytes");
        continue;
      }
      memcpy.push(memcpyMs);
      push.push(pushMs);
      pull.push(got.intoMs);
      view.push(got.viewMs);
    }
    progressDone();
    const s = { push: summarize(push), pull: summarize(pull), view: summarize(view), memcpy: summarize(memcpy) };
    const gbps = (ms: number): string => `${(REQUEST_BYTES / ms / 1e6).toFixed(2)} GB/s`;
    console.log(`request: ${BLOBS} x ${BLOB_BYTES} B = ${(REQUEST_BYTES / 1e6).toFixed(1)} MB, ${reps} reps after ${warmup} verified warm-up reps`);
    console.log(`memcpy (reference) ${fmt(s.memcpy)}  ${gbps(s.memcpy.median)}`);
    console.log(`push (producer)    ${fmt(s.push)}  ${gbps(s.push.median)}`);
    console.log(`pull into (copy)   ${fmt(s.pull)}  ${gbps(s.pull.median)}`);
    console.log(`pull views         ${fmt(s.view, "ms", 3)}`);
    finalLine({
      bench: "kv-transport",
      transport: "shm",
      push_ms: s.push.median,
      pull_ms: s.view.median,
      pull_copy_ms: s.pull.median,
      memcpy_ms: s.memcpy.median,
      ratio: (s.push.median + s.view.median) / s.memcpy.median,
      ratio_copy: (s.push.median + s.pull.median) / s.memcpy.median,
    });
  } finally {
    if (child.connected) child.send({ op: "exit" } satisfies ToConsumer);
    if (child.exitCode === null && child.signalCode === null) {
      const timer = setTimeout(() => child.kill("SIGKILL"), 5000);
      await once(child, "exit");
      clearTimeout(timer);
    }
    await producer.close();
    rmSync(root, { recursive: true, force: true });
  }
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const args = process.argv.slice(2);
  const i = args.indexOf("--consumer");
  if (i >= 0) await consumer(args[i + 1]);
  else await run(args);
}
