import { defineProject } from "vitest/config";

// Tests start real relay processes; on a loaded 2-core machine a node+tsx start can take seconds.
export default defineProject({ test: { name: "kv-relay", include: ["src/**/*.test.ts", "test/**/*.test.ts"], testTimeout: 60_000, hookTimeout: 60_000 } });
