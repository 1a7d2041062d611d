import { defineConfig } from "tsup";

export default defineConfig({
  entry: { index: "src/index.ts", "sidecar-cli": "src/sidecar-cli.ts", "info-cli": "src/info-cli.ts" },
  format: ["esm"],
  dts: { entry: { index: "src/index.ts" } },
  clean: true,
  target: "node24",
});
