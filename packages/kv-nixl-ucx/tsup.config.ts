import { defineConfig } from "tsup";

export default defineConfig({
  entry: { index: "src/index.ts", "ucx-thread": "src/ucx-thread.ts", "ucx-info-cli": "src/ucx-info-cli.ts" },
  format: ["esm"],
  dts: { entry: { index: "src/index.ts" } },
  clean: true,
  target: "node24",
});
