// pnpm bench kv-window [--model gemma-3-270m] [--positions 512,2000,4096]
// What a sequence's KV costs on a model with sliding-window layers (Gemma 3: five local layers of
// a 512-position window to one global), at several lengths: the bytes its blocks hold in the
// model's two pools after a prefill of that many positions (chunks of 256, as the engine's pass
// budget cuts a long prompt), against the reference measured on the same cache: the same blocks
// with every layer's K and V (what one pool of all layers held, and what the KV budget charges).
// And the bytes a PD handoff of that prompt moves (sliding-window layers without the blocks the
// window has left) against every layer's blobs. Final line: {"bench":"kv-window", ...}.
import { loadCheckpoint, LlamaModel, resolveCachedModel } from "../packages/llama/src/index.ts";
import { int, list, text, flagOf } from "../packages/rm-core/src/index.ts";
import { pushShape, pushedBytes } from "../packages/worker/src/kv-handoff.ts";
import { benchArgs, finalLine } from "./lib.ts";

const args = benchArgs("kv-window", "KV held and moved per sequence on a sliding-window model, against every layer's blocks", {
  model: flagOf(text({ label: "name" }), { default: "gemma-3-270m", doc: "a pulled model with sliding-window layers (airm model pull NAME)" }),
  positions: flagOf(list(int({ min: 1, max: 32768 })), { default: [512, 2000, 4096], doc: "sequence lengths to measure" }),
});

const found = await resolveCachedModel(args.model);
if (!found) {
  console.error(`kv-window needs the pulled model: pnpm exec airm model pull ${args.model}`);
  process.exit(2);
}
const ckpt = await loadCheckpoint(found.path);
const model = await LlamaModel.load(ckpt);
const local = model.homes.local;
if (!local) {
  console.error(`${args.model} has no sliding-window layers kept apart: nothing to measure`);
  process.exit(2);
}
const c = model.config;
const info = {
  layers: c.numLayers,
  kvHeads: c.numKvHeads,
  headDim: c.headDim,
  slidingWindow: { window: local.window, layers: model.homes.windowed.flatMap((w, l) => (w ? [l] : [])) },
};
const rows: Record<string, number>[] = [];
for (const n of args.positions) {
  const cache = model.newCache(n);
  const tokens = Array.from({ length: n }, (_, i) => 1000 + ((i * 7919) % 20000));
  for (let at = 0; at < n; at += 256) model.prefill(tokens.slice(at, at + 256), cache);
  const held = model.kvPool.usedBlocks * model.kvPool.blockBytes + local.pool.usedBlocks * local.pool.blockBytes;
  const allLayers = model.kvPool.usedBlocks * model.kvBlockBytes;
  const shape = pushShape(info as Parameters<typeof pushShape>[0], n, model.kvPool.blockSize);
  const moved = pushedBytes(shape, c.numLayers);
  const everyBlock = pushedBytes({ ...shape, slidingWindow: undefined }, c.numLayers);
  model.freeCache(cache);
  const row = {
    positions: n,
    heldMB: +(held / 1e6).toFixed(2),
    allLayersMB: +(allLayers / 1e6).toFixed(2),
    heldRatio: +(held / allLayers).toFixed(3),
    movedMB: +(moved / 1e6).toFixed(2),
    everyBlockMB: +(everyBlock / 1e6).toFixed(2),
    movedRatio: +(moved / everyBlock).toFixed(3),
  };
  console.log(
    `${n} positions: KV held ${row.heldMB} MB (every layer's blocks: ${row.allLayersMB} MB, ${row.heldRatio}x); handoff moves ${row.movedMB} MB (every block: ${row.everyBlockMB} MB, ${row.movedRatio}x)`,
  );
  rows.push(row);
}
model.close();
finalLine({ bench: "kv-window", model: args.model, window: local.window, blockSize: model.kvPool.blockSize, rows });
