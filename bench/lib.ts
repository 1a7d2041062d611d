// Shared bench plumbing: repeat-and-summarise, the final JSON line, TTY-only progress.

export interface Summary {
  median: number;
  min: number;
  max: number;
  n: number;
}

export function summarize(xs: number[]): Summary {
  const s = [...xs].sort((a, b) => a - b);
  const mid = s.length >> 1;
  const median = s.length % 2 ? s[mid] : (s[mid - 1] + s[mid]) / 2;
  return { median, min: s[0], max: s[s.length - 1], n: s.length };
}

export function fmt(s: Summary, unit = "ms", digits = 2): string {
  return `${s.median.toFixed(digits)} ${unit} (min ${s.min.toFixed(digits)}, max ${s.max.toFixed(digits)}, n=${s.n})`;
}

/** Prints the bench's one final JSON line (always last on stdout). */
export function finalLine(obj: Record<string, unknown>): void {
  const round = (v: unknown): unknown => (typeof v === "number" && !Number.isInteger(v) ? Number(v.toFixed(4)) : v);
  console.log(JSON.stringify(Object.fromEntries(Object.entries(obj).map(([k, v]) => [k, round(v)]))));
}

/** Progress on a TTY only (stderr), quiet in CI and pipes. */
export function progress(msg: string): void {
  if (process.stderr.isTTY) process.stderr.write(`\r\x1b[K${msg}`);
}
export function progressDone(): void {
  if (process.stderr.isTTY) process.stderr.write("\r\x1b[K");
}

export function argValue(args: string[], name: string, fallback?: string): string | undefined {
  const i = args.indexOf(`--${name}`);
  if (i >= 0 && i + 1 < args.length) return args[i + 1];
  const eq = args.find((a) => a.startsWith(`--${name}=`));
  return eq ? eq.slice(name.length + 3) : fallback;
}
