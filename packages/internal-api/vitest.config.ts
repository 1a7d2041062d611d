import { defineProject } from "vitest/config";

export default defineProject({ test: { name: "internal-api", include: ["src/**/*.test.ts", "test/**/*.test.ts"] } });
