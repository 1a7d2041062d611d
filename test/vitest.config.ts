import { defineProject } from "vitest/config";

// Checks over the whole repository: generated docs are current, every variable is declared,
// package boundaries hold, functions in the hosts stay short.
export default defineProject({ test: { name: "repo", include: ["*.test.ts"] } });
