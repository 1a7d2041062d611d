import { join } from "node:path";
import { defineConfig } from "vitest/config";

// The chart on a REAL kubelet node (containerd + kubelet, scripts/k8s-rig/node.ts) beside kwok's
// fake nodes. Run by `pnpm test:k8s-node` (scripts/k8s-rig/test-node.sh), which builds the rig's
// and the node's binaries and the image first, then runs this project as root inside private
// network and mount namespaces set up as the node's host. A signal that stops the run reaches the
// workers, whose rigs' teardowns finish before vitest exits (../hold-workers.ts).
export default defineConfig({
  test: {
    name: "k8s-node",
    root: import.meta.dirname,
    include: ["*.test.ts"],
    globalSetup: [join(import.meta.dirname, "..", "hold-workers.ts")],
    fileParallelism: false,
    testTimeout: 400_000,
    hookTimeout: 900_000,
  },
});
