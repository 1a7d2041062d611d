"""Reference logits for a Hugging Face Llama/Qwen2 folder: transformers resolves the config
(AutoConfig), tokenizes and renders the chat template (AutoTokenizer); the forward pass is plain
numpy in float64 over the stored bf16 weights. Shares no code with the project's engine.

    python numpy_reference.py MODEL_DIR OUT_PREFIX (--text FILE --max-tokens N | --chat "question")

Writes OUT_PREFIX.json (the resolved config values, the token ids, and for --chat the last
position's top-20 log-probabilities) and OUT_PREFIX.f32 (float32 logits, one row of vocab_size per
position: row i predicts token i + 1).
"""

import argparse
import json
import os

import numpy as np
import safetensors
from transformers import AutoConfig, AutoTokenizer


def load_weights(model_dir):
    files = []
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        files = sorted(set(json.load(open(index))["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    out = {}
    for f in files:
        for name, t in safetensors.deserialize(open(os.path.join(model_dir, f), "rb").read()):
            raw = np.frombuffer(bytes(t["data"]), dtype={"BF16": np.uint16, "F16": np.float16, "F32": np.float32}[t["dtype"]])
            if t["dtype"] == "BF16":
                raw = (raw.astype(np.uint32) << 16).view(np.float32)
            out[name] = raw.astype(np.float64).reshape(t["shape"])
    return out


def inv_freq(cfg, head_dim):
    rope = cfg.rope_parameters
    base = rope["rope_theta"]
    inv = 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    kind = rope.get("rope_type", "default")
    if kind == "default":
        return inv
    assert kind == "llama3", f"reference knows default and llama3 rope, not {kind}"
    factor, low, high, old = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"], rope["original_max_position_embeddings"]
    wavelen = 2 * np.pi / inv
    scaled = np.where(wavelen > old / low, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    mid = (1 - smooth) * scaled / factor + smooth * scaled
    is_mid = (wavelen >= old / high) & (wavelen <= old / low)
    return np.where(is_mid, mid, scaled)


def rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    rot = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rot * sin


def forward(cfg, W, ids):
    T = len(ids)
    H, nh, nkv = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads
    hd = getattr(cfg, "head_dim", None) or H // nh
    eps = cfg.rms_norm_eps
    angles = np.outer(np.arange(T, dtype=np.float64), inv_freq(cfg, hd))
    cos = np.cos(np.concatenate([angles, angles], axis=-1))[:, None, :]
    sin = np.sin(np.concatenate([angles, angles], axis=-1))[:, None, :]
    mask = np.triu(np.full((T, T), -np.inf), k=1)
    x = W["model.embed_tokens.weight"][ids]
    for layer in range(cfg.num_hidden_layers):
        p = f"model.layers.{layer}."
        h = rms_norm(x, W[p + "input_layernorm.weight"], eps)
        proj = {}
        for n in "qkv":
            y = h @ W[p + f"self_attn.{n}_proj.weight"].T
            bias = W.get(p + f"self_attn.{n}_proj.bias")
            proj[n] = y if bias is None else y + bias
        q = rotate(proj["q"].reshape(T, nh, hd), cos, sin)
        k = rotate(proj["k"].reshape(T, nkv, hd), cos, sin)
        v = proj["v"].reshape(T, nkv, hd)
        group = nh // nkv
        out = np.empty((T, nh, hd))
        for head in range(nh):
            kv = head // group
            s = q[:, head, :] @ k[:, kv, :].T / np.sqrt(hd) + mask
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            out[:, head, :] = (s / s.sum(axis=-1, keepdims=True)) @ v[:, kv, :]
        x = x + out.reshape(T, nh * hd) @ W[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, W[p + "post_attention_layernorm.weight"], eps)
        g = h @ W[p + "mlp.gate_proj.weight"].T
        u = h @ W[p + "mlp.up_proj.weight"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ W[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, W["model.norm.weight"], eps)
    head = W["model.embed_tokens.weight"] if cfg.tie_word_embeddings else W["lm_head.weight"]
    return x @ head.T


def log_softmax(row):
    m = row.max()
    return row - (m + np.log(np.exp(row - m).sum()))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--text")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--chat")
    a = ap.parse_args()
    cfg = AutoConfig.from_pretrained(a.model)
    tok = AutoTokenizer.from_pretrained(a.model)
    if a.chat is not None:
        ids = tok.apply_chat_template([{"role": "user", "content": a.chat}], add_generation_prompt=True, tokenize=True)
        if hasattr(ids, "keys"):
            ids = ids["input_ids"]
    else:
        ids = tok(open(a.text).read(), add_special_tokens=False)["input_ids"][: a.max_tokens]
    ids = [int(i) for i in ids]
    logits = forward(cfg, load_weights(a.model), ids)
    logits.astype(np.float32).tofile(a.out + ".f32")
    last = log_softmax(logits[-1])
    top = np.argsort(-last, kind="stable")[:20]
    meta = {
        "ids": ids,
        "vocab_size": int(logits.shape[1]),
        "config": {
            "rope_parameters": dict(cfg.rope_parameters),
            "rms_norm_eps": cfg.rms_norm_eps,
            "tie_word_embeddings": cfg.tie_word_embeddings,
            "num_key_value_heads": cfg.num_key_value_heads,
            "head_dim": getattr(cfg, "head_dim", None),
            "max_position_embeddings": cfg.max_position_embeddings,
        },
        "last_top_logprobs": [[int(t), float(last[t])] for t in top],
    }
    if a.chat is not None:
        meta["prompt_text"] = tok.apply_chat_template([{"role": "user", "content": a.chat}], add_generation_prompt=True, tokenize=False)
    json.dump(meta, open(a.out + ".json", "w"))


if __name__ == "__main__":
    main()
