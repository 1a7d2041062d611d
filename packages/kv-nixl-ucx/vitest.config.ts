import { defineProject } from "vitest/config";

export default defineProject({ test: { name: "kv-nixl-ucx", include: ["src/**/*.test.ts", "test/**/*.test.ts"] } });
