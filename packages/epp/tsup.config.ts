import { defineConfig } from "tsup";

export default defineConfig({
  entry: { index: "src/index.ts", testing: "src/testing/index.ts", "epp-cli": "src/epp-cli.ts" },
  format: ["esm"],
  dts: true,
  clean: true,
  target: "node24",
});
