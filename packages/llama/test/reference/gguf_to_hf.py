"""Turn a llama-architecture GGUF into a Hugging Face model folder, the way a user would with the
current transformers, but without torch: tensors are dequantised with the `gguf` package, the q/k
rows llama.cpp permuted for its RoPE are put back, weights are rounded to bfloat16 (nearest even)
and written with `safetensors`; config and tokenizer are built and saved by transformers itself.

    python gguf_to_hf.py MODEL.gguf OUT_DIR     # as transformers 5 writes a folder
    python gguf_to_hf.py --to-4x DIR            # rewrite DIR's config and template as 4.x did

transformers 5 writes config.json with `rope_parameters` and `dtype` and no top-level
`rope_theta`, and the chat template only to chat_template.jinja. --to-4x rewrites those files
the way transformers 4.x stored them: top-level `rope_theta`, `rope_scaling: null`,
`torch_dtype`, the chat template inside tokenizer_config.json (weights untouched).

Shares no code with the project's TypeScript loader.
"""

import argparse
import json
import os

import numpy as np
import safetensors
from gguf import GGUFReader
from gguf.quants import dequantize
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import LlamaConfig, PreTrainedTokenizerFast

TOKEN_TYPE_CONTROL = 3


def field(reader, key, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def to_bf16_bits(x):
    """float32 array -> uint16 bfloat16 bits, round to nearest even (no NaN in weights)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def unpermute(w, n_head):
    """Inverse of llama.cpp's convert permute: interleaved rotary pairs back to two halves per head."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


HF_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}


def hf_name(name):
    if name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if name == "output_norm.weight":
        return "model.norm.weight"
    if name == "output.weight":
        return "lm_head.weight"
    blk, layer, part, kind = name.split(".")
    assert blk == "blk", name
    return f"model.layers.{layer}.{HF_NAMES[part]}.{kind}"


def write_weights(reader, out, n_head, n_kv):
    tensors = {}
    keep = []
    for t in reader.tensors:
        w = dequantize(t.data, t.tensor_type).astype(np.float32)
        if t.name.endswith("attn_q.weight"):
            w = unpermute(w, n_head)
        elif t.name.endswith("attn_k.weight"):
            w = unpermute(w, n_kv)
        bits = np.ascontiguousarray(to_bf16_bits(w))
        keep.append(bits)
        tensors[hf_name(t.name)] = safetensors.TensorSpec(dtype="bfloat16", shape=list(bits.shape), data_ptr=bits.ctypes.data, data_len=bits.nbytes)
    safetensors.serialize_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    return "lm_head.weight" in tensors


def write_tokenizer(reader, out, bos_id, eos_id):
    tokens = field(reader, "tokenizer.ggml.tokens")
    types = field(reader, "tokenizer.ggml.token_type")
    merges = [tuple(m.split(" ", 1)) for m in field(reader, "tokenizer.ggml.merges")]
    assert field(reader, "tokenizer.ggml.model") == "gpt2", "only byte-level BPE GGUFs are converted"
    assert field(reader, "tokenizer.ggml.pre") in ("smollm", "starcoder"), "the pre-tokenizer built here is SmolLM2's"
    tk = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, byte_fallback=False))
    # SmolLM2 / StarCoder: every digit on its own, then GPT-2's byte-level split
    tk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tk.decoder = decoders.ByteLevel()
    tk.post_processor = processors.ByteLevel(trim_offsets=False)
    specials = [tokens[i] for i, ty in enumerate(types) if ty == TOKEN_TYPE_CONTROL]
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk,
        bos_token=tokens[bos_id],
        eos_token=tokens[eos_id],
        unk_token=tokens[field(reader, "tokenizer.ggml.unknown_token_id", 0)],
        pad_token=tokens[field(reader, "tokenizer.ggml.padding_token_id", eos_id)],
        additional_special_tokens=[s for s in specials if s not in (tokens[bos_id], tokens[eos_id])],
        model_max_length=field(reader, "llama.context_length"),
    )
    tok.chat_template = field(reader, "tokenizer.chat_template")
    tok.save_pretrained(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("gguf", nargs="?")
    ap.add_argument("out", nargs="?")
    ap.add_argument("--to-4x", dest="to4x", metavar="DIR")
    a = ap.parse_args()
    if a.to4x:
        to_4x(a.to4x)
        return
    if not (a.gguf and a.out):
        ap.error("give MODEL.gguf OUT_DIR, or --to-4x DIR")
    reader = GGUFReader(a.gguf)
    assert field(reader, "general.architecture") == "llama", "only llama GGUFs are converted"
    n_head = int(field(reader, "llama.attention.head_count"))
    n_kv = int(field(reader, "llama.attention.head_count_kv", n_head))
    hidden = int(field(reader, "llama.embedding_length"))
    bos_id = int(field(reader, "tokenizer.ggml.bos_token_id"))
    eos_id = int(field(reader, "tokenizer.ggml.eos_token_id"))
    os.makedirs(a.out, exist_ok=True)
    has_head = write_weights(reader, a.out, n_head, n_kv)
    # the GGUF stores eps as float32; the model's own value is its decimal
    eps = float(np.format_float_positional(np.float32(field(reader, "llama.attention.layer_norm_rms_epsilon")), unique=True))
    config = LlamaConfig(
        architectures=["LlamaForCausalLM"],
        vocab_size=int(field(reader, "llama.vocab_size", len(field(reader, "tokenizer.ggml.tokens")))),
        hidden_size=hidden,
        intermediate_size=int(field(reader, "llama.feed_forward_length")),
        num_hidden_layers=int(field(reader, "llama.block_count")),
        num_attention_heads=n_head,
        num_key_value_heads=n_kv,
        head_dim=int(field(reader, "llama.rope.dimension_count", hidden // n_head)),
        max_position_embeddings=int(field(reader, "llama.context_length")),
        rms_norm_eps=eps,
        rope_parameters={"rope_type": "default", "rope_theta": float(field(reader, "llama.rope.freq_base", 10000.0))},
        tie_word_embeddings=not has_head,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        dtype="bfloat16",
    )
    config.save_pretrained(a.out)
    write_tokenizer(reader, a.out, bos_id, eos_id)


def to_4x(out):
    """Rewrites a transformers-5 folder's config and template the way transformers 4.x stored them."""
    path = os.path.join(out, "config.json")
    c = json.load(open(path))
    rope = c.pop("rope_parameters")
    assert rope["rope_type"] == "default"
    c["rope_theta"] = rope["rope_theta"]
    c["rope_scaling"] = None
    c["torch_dtype"] = c.pop("dtype")
    c["transformers_version"] = "4.42.3"
    with open(path, "w") as f:
        json.dump(c, f, indent=2, sort_keys=True)
    jinja = os.path.join(out, "chat_template.jinja")
    tc_path = os.path.join(out, "tokenizer_config.json")
    tc = json.load(open(tc_path))
    with open(jinja) as f:
        tc["chat_template"] = f.read()
    os.remove(jinja)
    with open(tc_path, "w") as f:
        json.dump(tc, f, indent=2)


if __name__ == "__main__":
    main()
