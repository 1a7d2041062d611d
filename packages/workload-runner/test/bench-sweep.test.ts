// `airm bench sweep` and `report` as a user runs them: the sweep is a real `airm` process against
// a scripted OpenAI server (real HTTP and SSE; a real engine cannot be made to take chosen
// times), killed after its first point and run again: the second run skips what is done and
// repeats nothing. The report turns the rows into a page whose plots are SVG documents.
import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { isAirmError } from "@airm/rm-core";
import { loadSweepConfig, readSweepRows, sweepPoints, writeReport } from "../src/index.ts";

const airm = fileURLToPath(new URL("../bin/airm.mjs", import.meta.url));
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
let server: Server;
let url: string;
let dir: string;

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), "airm-sweep-"));
  server = createServer(async (req, res) => {
    if (req.url === "/v1/models") return res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ data: [{ id: "scripted" }] }));
    for await (const _ of req) {
      // drain the body
    }
    res.writeHead(200, { "content-type": "text/event-stream" });
    await sleep(30);
    for (let t = 0; t < 4; t++) {
      if (t) await sleep(10);
      res.write(`data: ${JSON.stringify({ choices: [{ index: 0, text: "a" }] })}\n\n`);
    }
    res.end(`data: ${JSON.stringify({ choices: [], usage: { completion_tokens: 4 } })}\n\ndata: [DONE]\n\n`);
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});
afterAll(() => {
  server.close();
  rmSync(dir, { recursive: true, force: true });
});

describe("airm bench sweep", () => {
  it("refuses a sweep file with a bad field, naming it", () => {
    const bad = join(dir, "bad.yaml");
    writeFileSync(bad, "concurrency: [1]\nrate: [2]\nrequests: 3\n");
    const e = (() => {
      try {
        return loadSweepConfig(bad);
      } catch (err) {
        return err;
      }
    })();
    expect(isAirmError(e, "CONFIG")).toBe(true);
    expect((e as Error).message).toContain("either concurrency");
    writeFileSync(bad, `url: ${url}\ntransport: [shm, tcp]\nconcurrency: [1]\nrequests: 3\n`);
    expect(() => loadSweepConfig(bad)).toThrow(/cannot vary transport/);
  });

  it("resumes after a kill without repeating a done point", async () => {
    const config = join(dir, "resume.yaml");
    writeFileSync(config, `url: ${url}\nconcurrency: [1, 2, 3, 4]\nrequests: 6\ninputTokens: 8\noutputTokens: 4\n`);
    const out = join(dir, "rows.jsonl");
    const keys = sweepPoints(loadSweepConfig(config)).flatMap((m) => m.points.map((p) => p.key));
    expect(keys).toHaveLength(4);
    const first = spawn(process.execPath, [airm, "bench", "sweep", "--config", config, "--out", out], { stdio: "ignore" });
    for (let i = 0; i < 300 && !(existsSync(out) && readSweepRows(out).length >= 1); i++) await sleep(50);
    first.kill("SIGKILL");
    await new Promise((r) => first.once("exit", r));
    const before = readSweepRows(out).map((r) => r.key);
    expect(before.length).toBeGreaterThanOrEqual(1);
    expect(before.length).toBeLessThan(4);
    // not spawnSync: the scripted server lives in this process and must keep answering
    const second = spawn(process.execPath, [airm, "bench", "sweep", "--config", config, "--out", out], { stdio: ["ignore", "pipe", "pipe"] });
    let stdout = "";
    let stderr = "";
    second.stdout!.on("data", (d) => (stdout += d));
    second.stderr!.on("data", (d) => (stderr += d));
    const status = await new Promise((r) => second.once("exit", r));
    expect(status, stderr).toBe(0);
    const summary = JSON.parse(stdout.trim().split("\n").at(-1)!);
    expect(summary).toMatchObject({ bench: "airm-bench-sweep", skipped: before.length, ran: 4 - before.length });
    const rows = readSweepRows(out);
    expect(rows.map((r) => r.key).sort()).toEqual([...keys].sort());
    expect(rows.every((r) => r.ok === 6 && r.requests === 6 && r.rows?.length === 6)).toBe(true);
  });

  it("report: a page with the plots as SVG documents and a row per point", () => {
    const rows = readSweepRows(join(dir, "rows.jsonl"));
    const files = writeReport(rows, join(dir, "report"), { title: "test", command: "airm bench report --in rows.jsonl" });
    expect(files).toEqual(["README.md", "latency-throughput.svg", "ttft-vs-load.svg", "attainment-vs-load.svg", "ttft-cdf.svg"]);
    const md = readFileSync(join(dir, "report", "README.md"), "utf8");
    for (const f of files.slice(1)) {
      expect(md).toContain(`](${f})`);
      const svg = readFileSync(join(dir, "report", f), "utf8");
      expect(svg.startsWith('<svg xmlns="http://www.w3.org/2000/svg"')).toBe(true);
      expect(svg.trim().endsWith("</svg>")).toBe(true);
      expect(svg).toMatch(/<polyline|<circle/);
    }
    expect(md.split("\n").filter((l) => l.startsWith("| scripted") || /^\| \S+ B\d+/.test(l))).toHaveLength(4);
  });
});
