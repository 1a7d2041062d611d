import { defineProject } from "vitest/config";

// The chart on a real control plane (scripts/k8s-rig). The first run builds the rig's binaries
// (~11 min on 2 cores) unless .ci/run or `bash scripts/k8s-rig/build.sh` did it before.
export default defineProject({ test: { name: "k8s", include: ["*.test.ts"], testTimeout: 300_000, hookTimeout: 1_800_000 } });
