// The /health body of a ready scripted solo worker serving `model` (the gateway tests that talk to
// scripted HTTP servers instead of real workers).
import type { WorkerHealth } from "@airm/internal-api";

export function scriptedHealth(model = "scripted"): WorkerHealth {
  return {
    status: "ok",
    ready: true,
    role: "solo",
    backend: "scripted",
    engine: "scripted",
    device: null,
    model: { id: model, architecture: "llama", layers: 1, kvHeads: 1, headDim: 8, vocabSize: 16, modelFingerprint: model, numericsFingerprint: "n" },
    maxModelLen: 64,
    variants: [{ batch: 1, seqLen: 64 }],
    kvCache: { blockSize: 16, totalBlocks: 4, usedBlocks: 0, freeBlocks: 4, cachedBlocks: 0, preemptions: 0 },
    transport: null,
    leases: { outstanding: 0, expired: 0 },
    requests: { waiting: 0, running: 0, slots: 1 },
    error: null,
  };
}
