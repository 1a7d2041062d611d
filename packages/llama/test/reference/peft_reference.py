"""Reference logits and greedy tokens of LoRA adapters from Hugging Face PEFT itself: the base
folder loaded by transformers (AutoTokenizer with the folder's chat template, AutoModelForCausalLM
on CPU torch in float32, eager attention) and the adapter folder by PeftModel.from_pretrained,
which wraps each targeted Linear and adds lora_B(lora_A(x)) * scaling to its output. Shares no
code with the project's engine.

    python peft_reference.py JOB.json

JOB.json: {"runs": [{"dir": BASE, "adapter": ADAPTER_DIR or null, "out": OUT_PREFIX,
"chat": "question", "steps": 64}, ...]}. The KV cache stores K and V as bfloat16 (as our engine's
cache does; see transformers_reference.py). Each run writes OUT_PREFIX.bf16.f32 (float32 logits of
every position of prompt + continuation in one forward pass: row i predicts token i + 1) and
OUT_PREFIX.json (the prompt ids, the greedy continuation, the modules PEFT adapted and those whose
lora_B stayed zero, i.e. whose weights it did not find in the file).
"""

import json
import sys

import peft
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

from transformers_reference import greedy, kv_storage


def adapted_modules(model):
    """Names (as in the base model) of the modules PEFT wrapped, and of those whose lora_B is all zero."""
    adapted, zero_b = [], []
    for name, module in model.named_modules():
        if hasattr(module, "lora_A") and "default" in getattr(module, "lora_A", {}):
            short = name.removeprefix("base_model.model.")
            adapted.append(short)
            if not torch.any(module.lora_B["default"].weight != 0):
                zero_b.append(short)
    return sorted(adapted), sorted(zero_b)


def run(job):
    tok = AutoTokenizer.from_pretrained(job["dir"])
    model = AutoModelForCausalLM.from_pretrained(job["dir"], dtype=torch.float32, attn_implementation="eager")
    adapted, zero_b = [], []
    if job["adapter"]:
        model = PeftModel.from_pretrained(model, job["adapter"], is_trainable=False)
        adapted, zero_b = adapted_modules(model)
    model.eval()
    messages = [{"role": "user", "content": job["chat"]}]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    kv_storage("bf16")
    with torch.no_grad():
        new = greedy(model, ids, job["steps"])
        logits = model(torch.tensor([ids + new]), use_cache=True).logits[0].float().numpy()
    kv_storage("f32")
    logits.tofile(job["out"] + ".bf16.f32")
    meta = {
        "ids": ids,
        "greedy": new,
        "vocab_size": int(logits.shape[1]),
        "adapted": adapted,
        "zero_b": zero_b,
        "peft": peft.__version__,
        "torch": torch.__version__,
    }
    json.dump(meta, open(job["out"] + ".json", "w"))


def main():
    torch.set_num_threads(1)
    for job in json.load(open(sys.argv[1]))["runs"]:
        run(job)


if __name__ == "__main__":
    main()
