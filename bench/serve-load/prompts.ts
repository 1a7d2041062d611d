// Chat prompts from a seeded generator: the same seed gives the same prompts on every machine, so
// serve-load's systems get identical requests. Each asks for a short text about a few topic words.

export interface ChatPrompt {
  messages: { role: "user"; content: string }[];
}

const TASKS = ["Write a short story about", "Explain to a child", "Describe a day spent with", "Write a poem about", "Give three tips about", "Tell me a fact about"];
const WORDS = [
  "the sea",
  "a lighthouse",
  "mountains",
  "a red bicycle",
  "rain in the city",
  "an old library",
  "the moon",
  "a small garden",
  "trains",
  "a lost cat",
  "winter mornings",
  "the desert",
  "a busy market",
  "volcanoes",
  "honey bees",
  "a wooden boat",
];

/** mulberry32: a small seeded PRNG in [0, 1). */
export function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** `n` distinct one-turn chat prompts from `seed`. */
export function chatPrompts(seed: number, n: number): ChatPrompt[] {
  const r = rng(seed);
  const pick = <T>(xs: T[]): T => xs[Math.floor(r() * xs.length)]!;
  const seen = new Set<string>();
  const out: ChatPrompt[] = [];
  while (out.length < n) {
    const content = `${pick(TASKS)} ${pick(WORDS)} and ${pick(WORDS)}.`;
    if (seen.has(content)) continue;
    seen.add(content);
    out.push({ messages: [{ role: "user", content }] });
  }
  return out;
}
