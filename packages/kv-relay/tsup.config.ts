import { defineConfig } from "tsup";

export default defineConfig({
  entry: { index: "src/index.ts", testing: "src/testing/index.ts", "relay-cli": "src/relay-cli.ts" },
  format: ["esm"],
  dts: true,
  clean: true,
  target: "node24",
});
