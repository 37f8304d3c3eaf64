#!/usr/bin/env python3
"""polar against Hugging Face transformers on the same checkpoint, program
and device: decode tokens/s and prefill ms of both, and polar's speedup.

    pip install torch transformers safetensors
    python3 bench/compare_hf.py --model DIR [--program SPEC] [--device cuda|cpu]
                                [--prompt-len 128] [--gen 64] [--reps 3] [--polar build-cuda/polar] [--json OUT]

transformers runs in bfloat16 with sdpa attention, the model's layer list
rebuilt for the program (layers[i] for i in the program, one KV-cache slot
per position as polar keys its cache), greedy decoding with its cache. polar
runs `polar bench --json` on the same folder, program, prompt length and
device. Both time prefill of the same prompt length and per-token decode.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import torch
from transformers import AutoModelForCausalLM


def expand(spec, D):
    """polar's program grammar (base | A | A-B | xN, commas) -> layer list."""
    spec = spec.replace(" ", "")
    if spec == "base":
        return list(range(D))
    if spec.startswith("["):
        return json.loads(spec)
    out = []
    for term in spec.split(","):
        reps = 1
        if "x" in term:
            term, r = term.split("x")
            reps = int(r)
        a, _, b = term.partition("-")
        out += list(range(int(a), int(b or a) + 1)) * reps
    return out


def rebuild(model, program):
    layers = list(model.model.layers)
    types = list(getattr(model.config, "layer_types", None) or [])
    model.model.layers = torch.nn.ModuleList([layers[i] for i in program])
    for k, layer in enumerate(model.model.layers):
        layer.self_attn.layer_idx = k  # a cache slot per execution position
    model.config.num_hidden_layers = len(program)
    if types:
        model.config.layer_types = [types[i] for i in program]


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def time_hf(model, device, prompt_len, gen, reps):
    vocab = model.config.vocab_size
    ids = torch.tensor([[(1103515245 * i + 12345) % vocab for i in range(prompt_len)]], device=device)
    best_prefill, best_decode = float("inf"), float("inf")
    with torch.no_grad():
        for _ in range(reps + 1):  # the first is a warm-up
            sync(device)
            t0 = time.perf_counter()
            out = model(input_ids=ids, use_cache=True)
            sync(device)
            t1 = time.perf_counter()
            past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
            for _ in range(gen):
                out = model(input_ids=tok, past_key_values=past, use_cache=True)
                past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
            sync(device)
            t2 = time.perf_counter()
            best_prefill = min(best_prefill, (t1 - t0) * 1e3)
            best_decode = min(best_decode, (t2 - t1) * 1e3 / gen)
    return best_prefill, best_decode


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="a Hugging Face checkpoint folder")
    ap.add_argument("--program", default="base")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--polar", default=None, help="the polar binary (default: build-cuda/polar on cuda, else build/polar)")
    ap.add_argument("--json", default=None, help="also write the result here")
    args = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    polar = args.polar or os.path.join(root, "build-cuda" if args.device == "cuda" else "build", "polar")

    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16, attn_implementation="sdpa")
    D = model.config.num_hidden_layers
    program = expand(args.program, D)
    rebuild(model, program)
    model = model.to(args.device).eval()
    hf_prefill, hf_decode = time_hf(model, args.device, args.prompt_len, args.gen, args.reps)
    del model

    cmd = [polar, "bench", "--model", args.model, "--prompt-len", str(args.prompt_len), "--gen", str(args.gen),
           "--reps", str(args.reps), "--device", args.device, "--json"]
    if args.program != "base":
        cmd += ["--program", args.program]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"polar bench failed: {res.stderr.strip()}")
    bench = json.loads(res.stdout.splitlines()[0])
    run = bench["runs"][-1]  # the program (or base when no program was given)
    result = {
        "model": args.model, "program": args.program, "executed_layers": len(program), "n_layers": D,
        "device": args.device, "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None,
        "prompt_len": args.prompt_len, "gen": args.gen, "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "hf": {"prefill_ms": hf_prefill, "decode_ms_per_token": hf_decode, "decode_tok_s": 1e3 / hf_decode},
        "polar": {"prefill_ms": run["prefill_ms"], "decode_ms_per_token": run["decode_ms_per_token"],
                  "decode_tok_s": run["decode_tok_s"], "fraction_of_copy": run["fraction_of_copy"]},
        "speedup_decode": hf_decode / run["decode_ms_per_token"],
        "speedup_prefill": hf_prefill / run["prefill_ms"],
        "command": " ".join(cmd),
    }
    print(f"{args.model} program {args.program} ({len(program)} of {D} layers) on {args.device}")
    print(f"  transformers: prefill {hf_prefill:9.2f} ms, decode {hf_decode:8.3f} ms/token ({1e3 / hf_decode:8.1f} tok/s)")
    print(f"  polar:        prefill {run['prefill_ms']:9.2f} ms, decode {run['decode_ms_per_token']:8.3f} ms/token "
          f"({run['decode_tok_s']:8.1f} tok/s)")
    print(f"  speedup: decode {result['speedup_decode']:.2f}x, prefill {result['speedup_prefill']:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
