// CPU time of a process tree, by part, from Linux's /proc: what each part of a serving system
// spends per output token under load. serve-load reads it before and after each level.
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";

/** Clock ticks per second of /proc/<pid>/stat's utime and stime. */
const TICKS = (() => {
  try {
    return Number(execFileSync("getconf", ["CLK_TCK"], { encoding: "utf8" }).trim()) || 100;
  } catch {
    return 100;
  }
})();

/** The process and its descendants (via /proc/<pid>/task/<tid>/children); empty where /proc cannot tell. */
function tree(pid: number): number[] {
  const out = [pid];
  for (let i = 0; i < out.length; i++) {
    try {
      for (const line of readFileSync(`/proc/${out[i]}/task/${out[i]}/children`, "utf8").split(" ")) if (line.trim()) out.push(Number(line));
    } catch {
      // gone, or no /proc: nothing below it
    }
  }
  return out;
}

/** user + system seconds of one process (all its threads), or null once it is gone. */
function cpuSeconds(pid: number): number | null {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    const f = stat.slice(stat.lastIndexOf(")") + 2).split(" "); // fields from the 3rd on
    return (Number(f[11]) + Number(f[12])) / TICKS; // utime, stime: fields 14 and 15
  } catch {
    return null;
  }
}

/** A part's name from its command line, as `names` gives it (null: not a part to count). */
function partName(pid: number, names: (cmdline: string[]) => string | null): string | null {
  try {
    return names(readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0"));
  } catch {
    return null;
  }
}

/** CPU seconds by part name (parts of one name summed) of the named processes under `root`. */
export function cpuByPart(root: number, names: (cmdline: string[]) => string | null): Map<string, number> {
  const out = new Map<string, number>();
  for (const pid of tree(root)) {
    const name = partName(pid, names);
    const s = name === null ? null : cpuSeconds(pid);
    if (name !== null && s !== null) out.set(name, (out.get(name) ?? 0) + s);
  }
  return out;
}

/** after - before, part by part (parts that started in between count from zero). */
export function cpuDelta(before: Map<string, number>, after: Map<string, number>): Record<string, number> {
  return Object.fromEntries([...after].map(([k, v]) => [k, v - (before.get(k) ?? 0)]));
}

/** The parts of `airm up`: the workers by role, the gateway, a transport's sidecar (by their bin names). */
export function airmPart(argv: string[]): string | null {
  const bin = argv.find((a) => /\.m?[jt]s$/.test(a)) ?? "";
  if (/airm-worker/.test(bin)) {
    const role = argv.indexOf("--role");
    return `${argv[role + 1] ?? "?"} workers`;
  }
  if (/airm-gateway/.test(bin)) return "gateway";
  if (/relay|sidecar/.test(bin)) return "sidecar";
  return null;
}

/** Resident memory (VmRSS) of the process tree under `root`, in bytes (threads share theirs). */
export function rssOfTree(root: number): number {
  let bytes = 0;
  for (const pid of tree(root)) {
    try {
      const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"));
      if (m) bytes += Number(m[1]) * 1024;
    } catch {
      // gone
    }
  }
  return bytes;
}

/** Resident memory (VmRSS, bytes) by part name (parts of one name summed) of the named processes under `root`. */
export function rssByPart(root: number, names: (cmdline: string[]) => string | null): Map<string, number> {
  const out = new Map<string, number>();
  for (const pid of tree(root)) {
    const name = partName(pid, names);
    if (name === null) continue;
    try {
      const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"));
      if (m) out.set(name, (out.get(name) ?? 0) + Number(m[1]) * 1024);
    } catch {
      // gone
    }
  }
  return out;
}
