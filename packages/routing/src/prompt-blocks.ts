// A prompt's block ids as the workers name the blocks they keep: the hash chain of its full
// blocks of token ids (rm-core's block-hash.ts), rooted in the model and numerics fingerprints,
// the block size and the request's cache_salt, each hash as the 64-bit id KV events carry.

import { blockHashes, blockHashId, blockHashRoot, type BlockHashRoot } from "@airm/rm-core";
import type { BlockIds } from "./block-index.ts";

/** The ids of the full blocks of `tokens` (none past `maxBlocks`). */
export function promptBlockIds(root: BlockHashRoot, tokens: readonly number[], cacheSalt = "", maxBlocks = Number.POSITIVE_INFINITY): BlockIds {
  const blocks = Math.min(maxBlocks, Math.floor(tokens.length / root.blockSize));
  return blockHashes(blockHashRoot(root, cacheSalt), tokens, root.blockSize, blocks).map(blockHashId);
}
