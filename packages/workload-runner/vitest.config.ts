import { defineProject } from "vitest/config";

export default defineProject({ test: { name: "workload-runner", include: ["src/**/*.test.ts", "test/**/*.test.ts"], testTimeout: 180_000 } });
