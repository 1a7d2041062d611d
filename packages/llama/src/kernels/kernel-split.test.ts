// The two-thread split under a fast stream of jobs whose chunk counts differ from one to the next
// (attention tiles of 3, 64, 2, 18, ... descriptors, as a forward pass alternates them with
// matmuls). A thread late for one job must never claim a chunk of it with the next job's
// arguments: before claims closed ahead of the argument writes, this stream deadlocked within
// ~40,000 jobs (a stray finished-count left the caller waiting for a count it had passed).
// The outputs of every job equal the one-thread runtime's.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { KernelRuntime } from "./kernel-runtime.ts";

const KV = 3;
const D = 64;
const BS = 16;
const N = 40;
const MAX_TILES = 64;
const COUNTS = [3, 64, 2, 18, 64, 5];

interface Setup {
  rt: KernelRuntime;
  desc: number;
  out: number;
  ps: number;
  scratch: [number, number];
}

/** K/V blocks, queries and MAX_TILES tile descriptors (four consecutive queries of one KV head each). */
function setup(rt: KernelRuntime): Setup {
  const nb = Math.ceil(N / BS);
  const kBytes = KV * D * BS * 2;
  const blocks = rt.alloc(nb * 2 * kBytes);
  for (let i = 0; i < nb * kBytes; i++) rt.u16[(blocks >> 1) + i] = 0x3c00 + (i % 97);
  const table = rt.alloc(nb * 4);
  for (let j = 0; j < nb; j++) rt.u32[(table >> 2) + j] = blocks + j * 2 * kBytes;
  const q = rt.alloc(4 * MAX_TILES * D * 4);
  for (let i = 0; i < 4 * MAX_TILES * D; i++) rt.f32[(q >> 2) + i] = Math.sin(i);
  const out = rt.alloc(4 * MAX_TILES * D * 4);
  const ps = (N + 32) * 4;
  const scratch: [number, number] = [rt.alloc(4 * ps), rt.alloc(4 * ps)];
  const desc = rt.alloc(MAX_TILES * 64);
  for (let t = 0; t < MAX_TILES; t++) {
    const w = (desc >> 2) + t * 16;
    const g = t % KV;
    for (let i = 0; i < 4; i++) {
      rt.u32[w + i] = q + (t * 4 + i) * D * 4;
      rt.u32[w + 4 + i] = N - 3 + i;
      rt.u32[w + 11 + i] = out + (t * 4 + i) * D * 4;
    }
    rt.u32[w + 8] = table;
    rt.u32[w + 9] = g * D * BS * 2;
    rt.u32[w + 10] = kBytes + g * BS * D * 2;
  }
  return { rt, desc, out, ps, scratch };
}

const run = (s: Setup, count: number) => s.rt.attentionTiles(s.desc, count, BS, D, 0.125, s.ps, 0, s.scratch);
const outputs = (s: Setup) => Buffer.from(s.rt.u8.slice(s.out, s.out + 4 * MAX_TILES * D * 4));

let one: Setup;
let two: Setup;
beforeAll(async () => {
  one = setup(await KernelRuntime.create({ threads: 1 }));
  two = setup(await KernelRuntime.create({ threads: 2 }));
});
afterAll(() => {
  one?.rt.close();
  two?.rt.close();
});

describe("two-thread split", () => {
  it("runs 150,000 jobs of changing chunk counts without a lost or stray chunk, with the one-thread bits", () => {
    for (const count of COUNTS) run(one, count);
    const want = outputs(one);
    for (let i = 0; i < 150_000; i++) {
      run(two, COUNTS[i % COUNTS.length]);
      if (i % 15_000 === COUNTS.length - 1) expect(outputs(two).equals(want), `after job ${i}`).toBe(true);
    }
  }, 120_000);
});
