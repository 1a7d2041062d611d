import { join } from "node:path";
import { defineConfig } from "vitest/config";

// Tests that start rigs (netns hosts, containers, relays in namespaces) register their teardowns
// (scripts/rig-cleanup.ts); test/hold-workers.ts, in vitest's main process, lets those finish when
// a signal stops the run, in every project.
export default defineConfig({
  test: {
    projects: ["packages/*", "test"],
    globalSetup: [join(import.meta.dirname, "test", "hold-workers.ts")],
  },
});
