import { defineConfig } from "tsup";

export default defineConfig({
  entry: { index: "src/index.ts", "airm-model-cli": "src/tiny/airm-model-cli.ts" },
  format: ["esm"],
  dts: true,
  clean: true,
  target: "node24",
});
