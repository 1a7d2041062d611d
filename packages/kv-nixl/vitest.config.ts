import { defineProject } from "vitest/config";

export default defineProject({ test: { name: "kv-nixl", include: ["src/**/*.test.ts", "test/**/*.test.ts"] } });
