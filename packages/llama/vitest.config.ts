import { defineProject } from "vitest/config";

export default defineProject({ test: { name: "llama", include: ["src/**/*.test.ts", "test/**/*.test.ts"], testTimeout: 120_000 } });
