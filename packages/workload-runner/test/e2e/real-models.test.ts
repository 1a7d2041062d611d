// The models `airm model pull` knows, served as a user serves them: for each one that is in the
// model cache, the cluster `airm up --model NAME` starts (its defaults: a prefill worker, two
// decode workers sharing the idle core, KV over shm) and a solo worker on the same file. The instruct models answer the README's question right; the Gemma 3 base
// model has no chat template, so chat is refused by name and a completion continues the text;
// PD gives the solo worker's text, greedy and seeded. A model not pulled is skipped, with the
// reason (CI pulls the 0.5B only).
import { resolveCachedModel } from "@airm/llama";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startUpCluster, type RunningCluster } from "../../src/index.ts";
import { postJson } from "../helpers/cluster.ts";

const MODELS = [
  { name: "qwen2.5-coder-0.5b-instruct", chat: true },
  { name: "qwen2.5-coder-1.5b-instruct", chat: true },
  { name: "gemma-3-270m", chat: false },
] as const;

const pulled = await Promise.all(MODELS.map(async (m) => ({ ...m, path: (await resolveCachedModel(m.name))?.path })));
for (const m of pulled) if (!m.path) console.warn(`real models: ${m.name} skipped: not in the model cache (pnpm exec airm model pull ${m.name})`);

const QUESTION = [{ role: "user", content: "What is the capital of France?" }];
const SEEDED = { temperature: 0.8, top_p: 0.95, seed: 7 };

interface Answer {
  status: number;
  text: string;
  error?: { message: string; param: string | null };
}

async function ask(url: string, route: "chat" | "completions", body: Record<string, unknown>): Promise<Answer> {
  const r = await postJson(`${url}/v1/${route === "chat" ? "chat/completions" : "completions"}`, { max_tokens: 24, ...body });
  const json = r.body as { choices?: { text?: string; message?: { content: string } }[]; error?: Answer["error"] };
  const choice = json.choices?.[0];
  return { status: r.status, text: choice?.message?.content ?? choice?.text ?? "", error: json.error };
}

describe.each(pulled)("$name through airm up's PD path and solo", ({ name, chat, path }) => {
  let pd: RunningCluster;
  let solo: RunningCluster;
  let id: string;
  beforeAll(async () => {
    if (!path) return;
    const up = (adjust?: Parameters<typeof startUpCluster>[1]["adjust"]) =>
      startUpCluster(["--model", name, "--max-model-len", "1024"], { env: process.env, adjust }).then((r) => r.cluster);
    // one after the other: four workers loading at once on a busy 2-core machine is the slow way
    pd = await up();
    solo = await up((c) => ({ ...c, mode: "solo", prefill: undefined, decode: undefined, solo: [{ port: 0 }], coreBoard: false }));
    id = ((await (await fetch(`${pd.url}/v1/models`)).json()) as { data: { id: string }[] }).data[0]!.id;
  }, 600_000);
  afterAll(async () => {
    await Promise.all([pd?.stop(), solo?.stop()]);
  });

  /** The request greedy and seeded through PD and solo: 200, the same text, and Paris in the greedy one. */
  async function pdEqualsSolo(route: "chat" | "completions", request: Record<string, unknown>): Promise<void> {
    for (const sampling of [{ temperature: 0 }, SEEDED]) {
      const body = { model: id, ...request, ...sampling };
      const [a, b] = [await ask(pd.url, route, body), await ask(solo.url, route, body)];
      expect(a.status, JSON.stringify(a.error)).toBe(200);
      expect(a.text).toBe(b.text);
      if (sampling.temperature === 0) {
        console.log(`${name}, greedy: ${JSON.stringify(a.text)}`);
        expect(a.text).toMatch(/Paris/);
      }
    }
  }

  it.skipIf(!path || !chat)("answers the README's question right, and PD equals solo greedy and seeded", async () => {
    await pdEqualsSolo("chat", { messages: QUESTION });
  });

  it.skipIf(!path || chat)("refuses chat naming the missing template; a completion continues the text, PD equal to solo", async () => {
    const refused = await ask(pd.url, "chat", { model: id, messages: QUESTION });
    expect(refused.status).toBe(400);
    expect(refused.error?.message).toMatch(/chat template/);
    await pdEqualsSolo("completions", { prompt: "The Eiffel Tower is in the city of" });
  });

  it.skipIf(!path || chat)("a prompt past the 512-position sliding window: PD (out-of-window blocks dropped, stated in the manifest) equals solo", async () => {
    const prompt = `${Array.from({ length: 60 }, (_, i) => `Line ${i + 1}: the river ran past the old mill.`).join(" ")} The last line was line`;
    for (const sampling of [{ temperature: 0 }, SEEDED]) {
      const body = { model: id, prompt, max_tokens: 16, ...sampling };
      const r = await postJson(`${pd.url}/v1/completions`, body);
      const usage = (r.body as { usage?: { prompt_tokens: number } }).usage;
      expect(r.status, JSON.stringify(r.body)).toBe(200);
      expect(usage!.prompt_tokens).toBeGreaterThan(600);
      const [a, b] = [await ask(pd.url, "completions", body), await ask(solo.url, "completions", body)];
      expect(a.text).toBe(b.text);
      if (sampling.temperature === 0) console.log(`${name}, greedy past the window: ${JSON.stringify(a.text)}`);
    }
  });
});
