import { createRequire } from "node:module";
import { loadCheckpoint, HfTokenizer } from "./src/index.ts";
const require = createRequire(import.meta.url);
const xg = require("/tmp/xg/xgrammar.cjs");
const ck = await loadCheckpoint(process.env.HOME + "/.cache/airm/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf");
const tok = ck.tokenizer as HfTokenizer;
const V = ck.config.vocabSize;
console.log("vocab", V, tok.vocabSize, "eos", ck.config.eosTokenIds, tok.eosTokenIds);
const vocab: string[] = [];
for (let i = 0; i < V; i++) vocab.push(tok.idToToken(i) ?? "");
let t = performance.now();
const ti = await xg.TokenizerInfo.createTokenizerInfo(vocab, "byte_level", false, V, ck.config.eosTokenIds);
console.log("tokenizerInfo ms", performance.now() - t);
const compiler = await xg.GrammarCompiler.createGrammarCompiler(ti);
t = performance.now();
const schema = JSON.stringify({ type: "object", properties: { color: { enum: ["red", "green"] }, n: { type: "integer", minimum: 1, maximum: 10 } }, required: ["color", "n"] });
const cg = await compiler.compileJSONSchema(schema, true, -1);
console.log("compile schema ms", performance.now() - t);
t = performance.now();
const cj = await compiler.compileBuiltinJSONGrammar();
console.log("compile json ms", performance.now() - t);
const m = await xg.GrammarMatcher.createGrammarMatcher(cg, ck.config.eosTokenIds);
const text = '{"color": "red", "n": 7}';
const ids = tok.encode(text, { addSpecialTokens: false });
for (const id of ids) {
  const t0 = performance.now();
  const mask = await m.getNextTokenBitmask();
  const t1 = performance.now();
  const ok = (mask[id >> 5] >>> (id & 31)) & 1;
  const acc = m.acceptToken(id);
  let allowed = 0; for (let i = 0; i < V; i++) allowed += (mask[i >> 5] >>> (i & 31)) & 1;
  console.log(JSON.stringify(tok.idToToken(id)), ok, acc, allowed, (t1 - t0).toFixed(3));
}
const mask = await m.getNextTokenBitmask();
let allowed = []; for (let i = 0; i < V; i++) if ((mask[i >> 5] >>> (i & 31)) & 1) allowed.push(i);
console.log("end allowed", allowed, m.isTerminated());
console.log(m.acceptToken(2), m.isTerminated());
// invalid schema
try {
  const bad = await compiler.compileJSONSchema(JSON.stringify({ type: "nonsense" }), true, -1);
  console.log("bad compiled?", bad);
} catch (e) { console.log("bad schema threw:", (e as Error).message); }
try { const again = await compiler.compileJSONSchema(schema, true, -1); console.log("after abort ok", !!again); } catch (e) { console.log("after abort:", (e as Error).message); }
