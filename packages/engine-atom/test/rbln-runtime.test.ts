// Exercises the koffi binding of the RBLN C runtime API against a fake librbln_runtime.so built
// here from test/fixtures/fake-rbln-runtime.c with gcc (same signatures, no NPU).
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { isAirmError } from "@airm/rm-core";
import { denseLayerBytes, type NativeRuntimeError } from "@airm/engine-kit";
import { decodeGraphFile, decodeGraphIO, RblnDecodeGraph } from "../src/rbln-decode-graph.ts";
import { findRblnLibrary, RblnGraphSession, RblnRuntimeLibrary } from "../src/rbln-runtime.ts";

const source = fileURLToPath(new URL("./fixtures/fake-rbln-runtime.c", import.meta.url));
const dir = mkdtempSync(join(tmpdir(), "airm-rbln-"));
const libPath = join(dir, "librbln_runtime.so");
const partialLib = join(dir, "librbln_partial.so");
let lib: RblnRuntimeLibrary;

function graph(name: string, inputs: number[], outputs: number[]): string {
  const f = join(dir, name);
  writeFileSync(f, `FAKE-RBLN 1\nin ${inputs.join(" ")}\nout ${outputs.join(" ")}\n`);
  return f;
}

/** The fake's output recipe, recomputed here: (o + runs + sum_i in_i[j % len_i]) & 0xff. */
function expected(inputs: Uint8Array[], o: number, runs: number, n: number): Uint8Array {
  const out = new Uint8Array(n);
  for (let j = 0; j < n; j++) {
    let acc = o + runs;
    for (const x of inputs) acc += x[j % x.length];
    out[j] = acc & 0xff;
  }
  return out;
}

beforeAll(() => {
  execFileSync("gcc", ["-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o", libPath, source]);
  // A library missing rbln_run: an SDK older than the API the binding needs.
  const stripped = readFileSync(source, "utf8").replace(/RBLNRetCode rbln_run\(RBLNRuntime \*rt\) \{/, "static RBLNRetCode unused_run(RBLNRuntime *rt) {");
  writeFileSync(join(dir, "partial.c"), stripped.replace("#include <string.h>", "#include <string.h>\n__attribute__((unused))"));
  execFileSync("gcc", ["-shared", "-fPIC", "-O1", "-w", "-o", partialLib, join(dir, "partial.c")]);
  lib = RblnRuntimeLibrary.open(libPath);
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe("RBLN runtime binding (fake library)", () => {
  it("finds the library from AIRM_RBLN_LIB, and reports none without it on a host without the SDK", () => {
    expect(findRblnLibrary(libPath)).toBe(libPath);
    expect(findRblnLibrary(undefined)).toBeNull(); // this machine has no /usr/local/lib/librbln_runtime.so
  });

  it("loads a graph, reports its layouts, runs it and returns the outputs byte for byte", () => {
    const s = new RblnGraphSession(lib, graph("g1.rbln", [4, 8], [6, 3]), 0);
    expect(s.inputBytes).toEqual([4, 8]);
    expect(s.outputBytes).toEqual([6, 3]);
    const a = new Uint8Array([1, 2, 3, 4]);
    const b = new Uint8Array([10, 20, 30, 40, 50, 60, 70, 250]);
    s.setInput(0, a);
    s.setInput(1, b);
    s.run();
    expect([...s.output(0)]).toEqual([...expected([a, b], 0, 0, 6)]);
    expect([...s.output(1)]).toEqual([...expected([a, b], 1, 0, 3)]);
    a[0] = 99;
    s.setInput(0, a);
    s.run();
    expect([...s.output(0)]).toEqual([...expected([a, b], 0, 1, 6)]);
    s.close();
  });

  it("passes the runtime's own error messages through typed errors", () => {
    const g = graph("g2.rbln", [4], [4]);
    const err = (fn: () => unknown): NativeRuntimeError => {
      try {
        fn();
      } catch (e) {
        expect(isAirmError(e, "DEVICE")).toBe(true);
        return e as NativeRuntimeError;
      }
      throw new Error("expected an error");
    };
    expect(err(() => new RblnGraphSession(lib, g, 1)).message).toMatch(/rbln_create_runtime: device 1: device 1 not found/);
    expect(err(() => new RblnGraphSession(lib, join(dir, "missing.rbln"), 0)).message).toMatch(/cannot open compiled model/);
    writeFileSync(join(dir, "junk.rbln"), "not a graph");
    expect(err(() => new RblnGraphSession(lib, join(dir, "junk.rbln"), 0)).message).toMatch(/is not a compiled RBLN model/);
    const s = new RblnGraphSession(lib, g, 0);
    expect(err(() => s.run()).message).toMatch(/FAILURE: rbln_run: input 0 was never set/);
    expect(err(() => s.setInput(0, new Uint8Array(3))).message).toMatch(/takes 4 bytes, got 3/);
    expect(err(() => s.setInput(5, new Uint8Array(4))).message).toMatch(/does not exist/);
    expect(err(() => s.output(2)).message).toMatch(/does not exist/);
    s.close();
    expect(err(() => s.run()).message).toMatch(/closed/);
  });

  it("uses more than one device when the runtime has them", () => {
    const prev = process.env.FAKE_RBLN_DEVICES;
    process.env.FAKE_RBLN_DEVICES = "2";
    try {
      const s = new RblnGraphSession(lib, graph("g3.rbln", [2], [2]), 1);
      expect(s.deviceId).toBe(1);
      s.close();
    } finally {
      if (prev === undefined) delete process.env.FAKE_RBLN_DEVICES;
      else process.env.FAKE_RBLN_DEVICES = prev;
    }
  });

  it("names a missing library and a missing symbol", () => {
    expect(() => RblnRuntimeLibrary.open(join(dir, "nope.so"))).toThrow(/does not exist/);
    expect(() => RblnRuntimeLibrary.open(partialLib)).toThrow(/lacks rbln_run/);
  });
});

describe("ATOM decode graph contract (fake library)", () => {
  const shape = { layers: 2, kvHeads: 2, headDim: 4, vocabSize: 5 };
  const variant = { batch: 2, seqLen: 8 };
  const io = decodeGraphIO(shape, variant);

  it("checks every input and output size against the contract", () => {
    expect(io.inputs).toEqual([8, 8, 256, 256, 256, 256]);
    expect(io.outputs).toEqual([40, 32, 32, 32, 32]);
    const wrong = graph("decode-wrong.rbln", [8, 8, 256, 256, 256, 128], io.outputs);
    expect(() => new RblnDecodeGraph(lib, wrong, 0, shape, variant)).toThrow(/input 5 is 128 bytes, the contract needs 256/);
    const fewer = graph("decode-fewer.rbln", io.inputs, io.outputs.slice(0, 3));
    expect(() => new RblnDecodeGraph(lib, fewer, 0, shape, variant)).toThrow(/3 outputs/);
    expect(() => new RblnDecodeGraph(lib, join(dir, "decode-B9xS9.rbln"), 0, shape, variant)).toThrow(/compile the B2xS8 decode graph on the host first/);
  });

  it("feeds the whole host cache and returns each stream's logits and new K/V column", () => {
    const file = decodeGraphFile(dir, variant);
    writeFileSync(file, `FAKE-RBLN 1\nin ${io.inputs.join(" ")}\nout ${io.outputs.join(" ")}\n`);
    const g = new RblnDecodeGraph(lib, file, 0, shape, variant);
    const lb = denseLayerBytes(shape, 8);
    const host = { seqLen: 8, n: 3, k: [0, 1].map((l) => new Uint8Array(lb).map((_, i) => i + l)), v: [0, 1].map((l) => new Uint8Array(lb).map((_, i) => 3 * i + l)) };
    const [r] = g.step([host], [4]);
    // The inputs the graph saw, rebuilt: ids/positions as int32 rows, caches padded to B rows.
    const ids = new Uint8Array(new Int32Array([4, 0]).buffer);
    const pos = new Uint8Array(new Int32Array([3, 0]).buffer);
    const pad = (x: Uint8Array): Uint8Array => {
      const out = new Uint8Array(2 * lb);
      out.set(x);
      return out;
    };
    const seen = [ids, pos, pad(host.k[0]), pad(host.v[0]), pad(host.k[1]), pad(host.v[1])];
    expect([...new Uint8Array(r.logits.buffer)]).toEqual([...expected(seen, 0, 0, 40).subarray(0, 20)]);
    expect([...r.k[1]]).toEqual([...expected(seen, 3, 0, 32).subarray(0, 16)]);
    expect([...r.v[0]]).toEqual([...expected(seen, 2, 0, 32).subarray(0, 16)]);
    expect(() => g.step([host, host, host], [1, 2, 3])).toThrow(/1\.\.2 streams/);
    g.close();
  });
});
