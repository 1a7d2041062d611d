import { defineProject } from "vitest/config";

export default defineProject({ test: { name: "kv-shm", include: ["src/**/*.test.ts", "test/**/*.test.ts"] } });
