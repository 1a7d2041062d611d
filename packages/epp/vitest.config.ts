import { defineProject } from "vitest/config";

// Integration tests start gRPC servers and fake model servers on 127.0.0.1; the CLI tests start node+tsx.
export default defineProject({ test: { name: "epp", include: ["src/**/*.test.ts", "test/**/*.test.ts"], testTimeout: 60_000, hookTimeout: 60_000 } });
