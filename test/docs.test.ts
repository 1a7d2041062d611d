// The documentation printed from code is current, and the examples of docs/internal-api.md are
// bodies and events of the contract (each block marked with a schema name parses with it).
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { INTERNAL_API_SCHEMAS } from "@airm/internal-api";
import { describe, expect, test } from "vitest";
import { documents } from "../scripts/gen-docs.ts";

const root = join(import.meta.dirname, "..");

describe("generated documentation", () => {
  test.each([...documents()])("%s is what pnpm gen-docs prints", (file, content) => {
    expect(readFileSync(join(root, file), "utf8"), `${file} is out of date: run pnpm gen-docs`).toBe(content);
  });

  test("every example in docs/internal-api.md parses with the schema it names", () => {
    const md = readFileSync(join(root, "docs/internal-api.md"), "utf8");
    const blocks = [...md.matchAll(/```(json|ndjson) (\w+)\n([\s\S]*?)```/g)];
    expect(blocks.length).toBeGreaterThan(8);
    const named = new Set<string>();
    for (const [, kind, name, body] of blocks) {
      const entry = INTERNAL_API_SCHEMAS[name];
      expect(entry, `unknown schema ${name} in docs/internal-api.md`).toBeDefined();
      named.add(name);
      const docs = kind === "ndjson" ? body.trim().split("\n") : [body];
      for (const d of docs) {
        const r = entry.schema.safeParse(JSON.parse(d));
        expect(r.success, `${name} example does not parse: ${r.success ? "" : JSON.stringify(r.error.issues[0])}\n${d}`).toBe(true);
      }
    }
    for (const name of ["PrefillRequest", "DecodeRequest", "PrefillResponse", "WorkerEvent", "WorkerHealth", "ErrorBody", "ReleaseRequest", "ReleaseResponse"]) {
      expect(named, `docs/internal-api.md shows no ${name} example`).toContain(name);
    }
  });
});
