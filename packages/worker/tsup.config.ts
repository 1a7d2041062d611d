import { defineConfig } from "tsup";

export default defineConfig({
  entry: { index: "src/index.ts", cli: "src/cli.ts", "worker-config": "src/worker-config.ts" },
  format: ["esm"],
  dts: true,
  clean: true,
  target: "node24",
});
