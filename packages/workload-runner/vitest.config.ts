import { defineProject } from "vitest/config";

// The end-to-end tests start real clusters (workers, gateway, relay) through the launcher.
export default defineProject({ test: { name: "workload-runner", include: ["src/**/*.test.ts", "test/**/*.test.ts"], testTimeout: 180_000, hookTimeout: 240_000 } });
