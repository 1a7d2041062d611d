"""Reference logits and greedy tokens from Hugging Face transformers itself (AutoConfig,
AutoTokenizer with the folder's chat template, AutoModelForCausalLM with its own modeling code) on
CPU torch in float32, eager attention. Shares no code with the project's engine.

    python transformers_reference.py JOB.json

JOB.json: {"models": [{"dir": ..., "out": OUT_PREFIX, "chat": "question", "steps": 64}, ...]}.
Each model runs twice: as transformers ships it (K/V kept in float32) and with its KV cache
storing K and V as bfloat16 (every Cache.update rounds them, nearest even), which is what our
engine's cache stores. For each model and variant (VARIANT: f32, bf16) writes
OUT_PREFIX.VARIANT.f32 (float32 logits of every position of prompt + continuation in one forward
pass: row i predicts token i + 1) and OUT_PREFIX.json (the resolved config, the chat prompt's text
and ids, each variant's greedy continuation).
"""

import json
import sys

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from transformers.cache_utils import Cache

_update = Cache.update


def _update_bf16(self, key_states, value_states, layer_idx, *args, **kwargs):
    """Cache.update storing K and V as bfloat16 (round to nearest even), read back as float32."""
    round_ = lambda t: t.to(torch.bfloat16).to(t.dtype)  # noqa: E731
    return _update(self, round_(key_states), round_(value_states), layer_idx, *args, **kwargs)


def kv_storage(kind):
    Cache.update = _update_bf16 if kind == "bf16" else _update


def greedy(model, ids, steps):
    """Greedy continuation through the model's KV cache, no stop token: `steps` new ids."""
    out = model(torch.tensor([ids]), use_cache=True)
    new = []
    for _ in range(steps):
        token = int(torch.argmax(out.logits[0, -1]))
        new.append(token)
        out = model(torch.tensor([[token]]), past_key_values=out.past_key_values, use_cache=True)
    return new


def run(job):
    cfg = AutoConfig.from_pretrained(job["dir"])
    tok = AutoTokenizer.from_pretrained(job["dir"])
    model = AutoModelForCausalLM.from_pretrained(job["dir"], dtype=torch.float32, attn_implementation="eager")
    model.eval()
    messages = [{"role": "user", "content": job["chat"]}]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    greedy_by_kv = {}
    for kind in ("f32", "bf16"):
        kv_storage(kind)
        with torch.no_grad():
            new = greedy(model, ids, job["steps"])
            # use_cache: the one pass goes through Cache.update too, so its K/V are stored as in the variant
            logits = model(torch.tensor([ids + new]), use_cache=True).logits[0].float().numpy()
        logits.tofile(job["out"] + "." + kind + ".f32")
        greedy_by_kv[kind] = new
    kv_storage("f32")
    meta = {
        "prompt_text": text,
        "ids": ids,
        "greedy": greedy_by_kv,
        "vocab_size": int(logits.shape[1]),
        "config": {
            "architecture": cfg.architectures[0],
            "head_dim": getattr(cfg, "head_dim", None),
            "num_key_value_heads": cfg.num_key_value_heads,
            "rms_norm_eps": cfg.rms_norm_eps,
            "rope_parameters": dict(cfg.rope_parameters),
            "tie_word_embeddings": cfg.tie_word_embeddings,
            "sliding_window": getattr(cfg, "sliding_window", None),
            "layer_types": getattr(cfg, "layer_types", None),
            "query_pre_attn_scalar": getattr(cfg, "query_pre_attn_scalar", None),
        },
        "torch": torch.__version__,
    }
    json.dump(meta, open(job["out"] + ".json", "w"))


def main():
    torch.set_num_threads(1)
    for job in json.load(open(sys.argv[1]))["models"]:
        run(job)


if __name__ == "__main__":
    main()
