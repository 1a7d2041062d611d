// pnpm bench kv-transport --transport shm|tcp|nixl-ucx [--reps N]
// One 67.1 MB request (64 x 1 MiB blobs: Llama-3.1-8B at S=512) through the named transport,
// against that transport's reference measured in the same run. Each transport's procedure lives
// in bench/kv-transport/<name>.ts and prints the final JSON line.
import { argValue } from "./lib.ts";

const args = process.argv.slice(2);
const transport = argValue(args, "transport", "shm")!;
const modules: Record<string, string> = {
  shm: "./kv-transport/shm.ts",
  tcp: "./kv-transport/tcp.ts",
  "nixl-ucx": "./kv-transport/nixl-ucx.ts",
};
if (!modules[transport]) {
  console.error(`unknown --transport ${transport}; one of ${Object.keys(modules).join(", ")}`);
  process.exit(2);
}
const mod = (await import(modules[transport])) as { run(args: string[]): Promise<void> };
await mod.run(args);
