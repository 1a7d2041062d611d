#!/usr/bin/env node
// In the workspace the TypeScript sources run through tsx; a published package runs dist.
import { existsSync } from "node:fs";
const src = new URL("../src/info-cli.ts", import.meta.url);
if (existsSync(src)) (await import("tsx/esm/api")).register();
const { main } = await import(existsSync(src) ? src.href : new URL("../dist/info-cli.js", import.meta.url).href);
const code = await main();
if (code !== undefined) process.exitCode = code;
