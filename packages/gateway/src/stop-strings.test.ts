import { describe, expect, it } from "vitest";
import { StopStringFilter } from "./stop-strings.ts";

function run(stops: string[], deltas: string[]): { out: string; hit: boolean } {
  const f = new StopStringFilter(stops);
  let out = "";
  for (const d of deltas) {
    out += f.push(d);
    if (f.hit) break;
  }
  out += f.flush();
  return { out, hit: f.hit };
}

describe("StopStringFilter", () => {
  it("passes text through without stop strings", () => {
    expect(run([], ["ab", "c"])).toEqual({ out: "abc", hit: false });
  });
  it("cuts at a stop string split across deltas", () => {
    expect(run(["END"], ["hello E", "N", "D world"])).toEqual({ out: "hello ", hit: true });
  });
  it("releases a held-back prefix that did not become a stop string", () => {
    expect(run(["END"], ["hello E", "x", "!"])).toEqual({ out: "hello Ex!", hit: false });
  });
  it("cuts at the earliest of several stops", () => {
    expect(run(["b", "xyz"], ["axyzb"])).toEqual({ out: "a", hit: true });
  });
  it("never emits a part of a stop string before it completes", () => {
    const f = new StopStringFilter(["\n\n"]);
    expect(f.push("line\n")).toBe("line");
    expect(f.push("\nrest")).toBe("");
    expect(f.hit).toBe(true);
  });
});
