import { join } from "node:path";
import { defineConfig } from "vitest/config";

// The chart on a real control plane (scripts/k8s-rig). Run by `pnpm test:k8s`, which builds the
// rig's binaries first (~12 min on 2 cores the first time, cached by version) and then runs this
// project inside a network namespace of its own with only `lo` up, so nothing the rig or the pods
// start can listen beyond it. A signal that stops the run reaches the workers, whose rigs' teardowns
// finish before vitest exits (../hold-workers.ts).
export default defineConfig({
  test: {
    name: "k8s",
    root: import.meta.dirname,
    include: ["*.test.ts"],
    globalSetup: [join(import.meta.dirname, "..", "hold-workers.ts")],
    fileParallelism: false,
    testTimeout: 300_000,
    hookTimeout: 600_000,
  },
});
