import { defineProject } from "vitest/config";

export default defineProject({ test: { name: "grammar", include: ["src/**/*.test.ts", "test/**/*.test.ts"] } });
