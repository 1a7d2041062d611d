// pnpm bench kv-transport --transport shm|tcp|nixl-ucx|nixl [options of that transport's bench]
// One 67.1 MB request (64 x 1 MiB blobs: Llama-3.1-8B at S=512) through the named transport,
// against that transport's reference measured in the same run. Each transport's procedure lives
// in bench/kv-transport/<name>.ts, parses the whole command line strictly (its own flags plus
// --transport) and prints the final JSON line.

const args = process.argv.slice(2);
const i = args.findIndex((a) => a === "--transport" || a.startsWith("--transport="));
const transport = i < 0 ? "shm" : args[i].includes("=") ? args[i].slice("--transport=".length) : args[i + 1];
const modules: Record<string, string> = {
  shm: "./kv-transport/shm.ts",
  tcp: "./kv-transport/tcp.ts",
  "nixl-ucx": "./kv-transport/nixl-ucx.ts",
  nixl: "./kv-transport/nixl.ts",
};
if (!modules[transport]) {
  console.error(`unknown --transport ${transport}; one of ${Object.keys(modules).join(", ")}`);
  process.exit(2);
}
const mod = (await import(modules[transport])) as { run(args: string[]): Promise<void> };
await mod.run(args);
