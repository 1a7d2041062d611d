"""Perplexity of a GGUF on a text by Hugging Face transformers itself, as a float reference beside
ours and llama.cpp's (bench/quality/perplexity.ts): transformers dequantises the GGUF's tensors
to float32 (its own GGUF reader, the `gguf` package) and runs its own modeling code on CPU torch;
its tokenizer is the one it builds from the GGUF. Method as llama-perplexity's: chunks of CTX
tokens, BOS first, the second half of each chunk scored.

    python transformers_ppl.py MODEL.gguf TEXT_FILE [CTX] [CHUNKS]

Needs transformers and torch (packages/llama/test/reference/requirements-torch.txt) plus gguf and
accelerate. Prints one JSON line: ppl, tokens scored, chunks, tokens of the text.
"""

import json
import math
import os
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def main() -> None:
    gguf, text_file = sys.argv[1], sys.argv[2]
    ctx = int(sys.argv[3]) if len(sys.argv) > 3 else 512
    max_chunks = int(sys.argv[4]) if len(sys.argv) > 4 else 4
    folder, name = os.path.split(os.path.abspath(gguf))
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    model.eval()
    with open(text_file, encoding="utf-8") as f:
        ids = tok(f.read())["input_ids"]
    bos = tok.bos_token_id
    chunks = min(max_chunks, len(ids) // ctx)
    nll, count = 0.0, 0
    for i in range(chunks):
        chunk = ids[i * ctx : (i + 1) * ctx]
        if bos is not None and ids[0] == bos:
            chunk[0] = bos
        with torch.no_grad():
            logits = model(torch.tensor([chunk])).logits[0].double()
        logp = torch.log_softmax(logits, -1)
        for j in range(ctx // 2, ctx - 1):
            nll -= logp[j, chunk[j + 1]].item()
            count += 1
    print(json.dumps({"ppl": math.exp(nll / count), "count": count, "chunks": chunks, "tokens": len(ids)}))


if __name__ == "__main__":
    main()
