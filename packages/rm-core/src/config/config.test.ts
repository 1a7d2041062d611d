import { describe, expect, it } from "vitest";
import { isAirmError } from "../errors.ts";
import { defineCommand, flagOf, switchOf } from "./command-line.ts";
import { configMarkdown, defineConfig, opt } from "./config-spec.ts";
import { flag, hostPort, int, list, num, oneOf, parseInteger, text } from "./value-types.ts";

const spec = defineConfig("@airm/example", {
  addr: opt(hostPort(), { env: "EX_ADDR", default: "127.0.0.1:7400", doc: "Where the relay listens. Workers connect there." }),
  lanes: opt(int({ min: 1, max: 8 }), { env: "EX_LANES", default: 2, doc: "Read lanes." }),
  ratio: opt(num({ positive: true }), { env: "EX_RATIO", default: 0.5, doc: "A ratio." }),
  log: opt(flag(), { env: "EX_LOG", default: false, doc: "Log every blob." }),
  mode: opt(oneOf(["auto", "peer", "none"] as const), { env: "EX_MODE", default: "auto", doc: "Error mode." }),
  root: opt(text({ label: "path" }), { env: "EX_ROOT", defaultText: "/dev/shm/x", doc: "A folder." }),
  codeOnly: opt(int({ min: 0 }), { default: 3, doc: "Set in code only." }),
});

function errorOf(fn: () => unknown): { code: string; key: string; message: string } {
  try {
    fn();
  } catch (e) {
    return e as never;
  }
  throw new Error("did not throw");
}

describe("config specs", () => {
  it("resolve: explicit options over the environment over defaults, typed", () => {
    const v = spec.resolve({ env: { EX_LANES: " 4 ", EX_LOG: "yes", EX_MODE: "peer", EX_ROOT: "/tmp/r", EX_RATIO: "" } });
    expect(v).toEqual({ addr: "127.0.0.1:7400", lanes: 4, ratio: 0.5, log: true, mode: "peer", root: "/tmp/r", codeOnly: 3 });
    expect(spec.resolve({ env: { EX_LANES: "4" }, options: { lanes: 1, root: undefined } }).lanes).toBe(1);
    expect(spec.resolve({}).root).toBeUndefined();
  });

  it("a bad value is a ConfigError naming the variable it came from, or the option", () => {
    const fromEnv = errorOf(() => spec.resolve({ env: { EX_LANES: "9" } }));
    expect([fromEnv.code, fromEnv.key]).toEqual(["CONFIG", "EX_LANES"]);
    expect(fromEnv.message).toContain("expected a whole number 1..8, got 9");
    const fromOption = errorOf(() => spec.resolve({ options: { addr: "nohost" } }));
    expect(fromOption.key).toBe("addr");
    expect(fromOption.message).toContain("is not host:port");
    expect(errorOf(() => spec.resolve({ env: { EX_LOG: "maybe" } })).key).toBe("EX_LOG");
    expect(errorOf(() => spec.resolve({ env: { EX_MODE: "loud" } })).message).toContain("expected one of auto, peer, none");
    expect(errorOf(() => spec.resolve({ env: { EX_RATIO: "0" } })).message).toContain("expected a number > 0");
  });

  it("an unknown option is refused with the known ones listed", () => {
    const e = errorOf(() => spec.resolve({ options: { lane: 2 } }));
    expect(e.key).toBe("lane");
    expect(e.message).toContain("its options are addr, lanes, ratio, log, mode, root, codeOnly");
  });

  it("rows and the markdown table come from the declaration", () => {
    const rows = spec.rows();
    expect(rows.find((r) => r.option === "lanes")).toMatchObject({ env: "EX_LANES", type: "integer 1..8", default: "2" });
    expect(rows.find((r) => r.option === "root")).toMatchObject({ default: "/dev/shm/x" });
    const md = configMarkdown(rows);
    expect(md).toContain("| `EX_LOG` | 0\\|1 | `0` | Log every blob. |");
    expect(md).toContain("| option `codeOnly` | integer >= 0 | `3` | Set in code only. |");
    expect(spec.envNames()).toEqual(["EX_ADDR", "EX_LANES", "EX_RATIO", "EX_LOG", "EX_MODE", "EX_ROOT"]);
  });

  it("a variable declared twice in one spec is refused", () => {
    expect(() => defineConfig("x", { a: opt(flag(), { env: "X_A", default: true, doc: "a" }), b: opt(flag(), { env: "X_A", default: true, doc: "b" }) })).toThrow(/declared twice/);
  });

  it("value types parse text and code values the same way", () => {
    expect(parseInteger("+7")).toBe(7);
    expect(parseInteger(-1, { min: -1 })).toBe(-1);
    expect(() => parseInteger("7.5")).toThrow(/whole number/);
    expect(() => parseInteger("1e3")).toThrow(/whole number/);
    expect(() => parseInteger(" ", { min: 0 })).toThrow(/whole number >= 0/);
    expect(list(int({ min: 0 })).parse("1, 2,3")).toEqual([1, 2, 3]);
    expect(() => list(int({ min: 0 })).parse("1,x")).toThrow(/item 2/);
    expect(list(text(), /[,:]/).parse("/a:/b,/c")).toEqual(["/a", "/b", "/c"]);
    expect(flag().parse(" OFF ")).toBe(false);
  });
});

describe("command lines", () => {
  const cmd = defineCommand({
    name: "airm-demo",
    summary: "a demo",
    usage: ["airm-demo --role R [options]"],
    flags: {
      role: flagOf(oneOf(["prefill", "decode"] as const), { doc: "which role" }),
      port: flagOf(int({ min: 0, max: 65535 }), { default: 8101, doc: "HTTP port" }),
      chip: flagOf(int({ min: -1 }), { default: 0, doc: "card ordinal" }),
      B: flagOf(int({ min: 1 }), { name: "B", doc: "batch width", defaultText: "the engine's" }),
      seqLen: flagOf(int({ min: 8 }), { doc: "context" }),
      quiet: switchOf({ doc: "say less" }),
    },
    env: [spec],
  });

  it("parses typed values, kebab-case flags, negative numbers and defaults", () => {
    const p = cmd.parse(["--role", "decode", "--chip", "-1", "--seq-len=512", "--B", "4", "--quiet"]);
    expect(p.values).toEqual({ role: "decode", port: 8101, chip: -1, B: 4, seqLen: 512, quiet: true });
    expect(p.help).toBe(false);
  });

  it("refuses unknown flags, bad values and stray arguments with a UsageError naming the flag", () => {
    for (const [argv, want] of [
      [["--frobnicate"], "Unknown option '--frobnicate'"],
      [["--port", "http"], "--port: expected a whole number 0..65535"],
      [["--role", "gateway"], "--role: expected one of prefill, decode"],
      [["extra"], "Unexpected argument 'extra'"],
    ] as const) {
      const e = errorOf(() => cmd.parse([...argv]));
      expect(isAirmError(e, "USAGE")).toBe(true);
      expect(e.message).toContain(want);
    }
  });

  it("help lists every flag with its type and default, then the environment table", () => {
    const h = cmd.help();
    for (const s of [
      "--role PREFILL|DECODE",
      "--port INTEGER_0..65535",
      "(default 8101)",
      "--B INTEGER_>=_1",
      "(the engine's)",
      "--quiet",
      "environment:",
      "EX_LANES",
      "-h, --help",
    ]) {
      expect(h).toContain(s);
    }
  });
});
