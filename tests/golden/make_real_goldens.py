"""The llama.cpp half of the real-model goldens (tests/test_real_models.c).

For a real GGUF installed by `make models`, llama.cpp itself (the pinned
llama-cpp-python==0.3.36 build, the version bench/llamacpp_build.sh builds)
writes tests/golden/real/NAME.llama.safetensors:

  text.utf8       u8 [bytes]      a few hundred tokens of prose, arithmetic and code
  text.ids        i32 [N]         llama.cpp's tokens of it (no BOS: Qwen adds none)
  text.top_ids    i32 [N, K]      at every position the K most likely next tokens,
  text.top_lp     f32 [N, K]      and their log-probabilities (log-softmax in f64)
  pI.text         u8 [bytes]      prompt I: a raw text, or a user message (pI.chat 1)
  pI.chat         i32 [1]
  pI.ids          i32 [n]         its tokens (the raw text, or the GGUF's chat template
                                  rendered by jinja2 around the message)
  pI.greedy       i32 [T]         llama.cpp's greedy continuation, EOS ignored
  pI.margin       f32 [T]         top-1 minus top-2 logit at each of its steps

K/V rows are f32 (type_k/type_v), as polar's CPU cache, so what differs
is the matmul kernels, not the cache's rounding. The polar half
(NAME.reference.safetensors) is written by the test binary itself under
POLAR_CPU=reference from these very tokens: make_real_goldens.sh runs both.

    python3 tests/golden/make_real_goldens.py MODEL.gguf OUT.safetensors
"""
import json
import struct
import sys

import numpy as np
from jinja2 import Environment
from llama_cpp import Llama

K = 32    # top tokens kept a position
T = 32    # greedy steps a prompt
TEXT = (
    "A bakery sells muffins for $3 each and cookies for $2 each. On Monday it sold 41 muffins and "
    "twice as many cookies as muffins. How much money did it take in? It sold 41 * 2 = 82 cookies, "
    "which brought 82 * 2 = $164. The muffins brought 41 * 3 = $123. In all it took in "
    "164 + 123 = $287.\n\n"
    "The river rises in the hills north of the town, runs south through the old mill, and reaches "
    "the sea after forty miles. In spring the snow melts and the water climbs over the stones; by "
    "late summer a child can cross it without wetting her knees.\n\n"
    "def median(values):\n"
    "    \"\"\"Return the median of a non-empty list of numbers.\"\"\"\n"
    "    ordered = sorted(values)\n"
    "    middle = len(ordered) // 2\n"
    "    if len(ordered) % 2 == 1:\n"
    "        return ordered[middle]\n"
    "    return (ordered[middle - 1] + ordered[middle]) / 2\n\n"
    "for n in [3, 1, 4, 1, 5, 9, 2, 6]:\n"
    "    print(n, n * n, median([n, n + 1, n + 5]))\n\n"
    "Question: A train leaves at 9:15 and arrives at 13:40. How long is the journey?\n"
    "Answer: From 9:15 to 13:15 is 4 hours, and from 13:15 to 13:40 is 25 minutes, so the journey "
    "takes 4 hours 25 minutes.\n"
)
RAW_PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]
CHAT_PROMPTS = ["What is 17 * 23? Answer with the number only.",
                "Write a haiku about the sea."]


def top_k_logprobs(logits):
    """The K largest log-probabilities of each row, most likely first (ties to the lower id)."""
    rows = logits.astype(np.float64)
    lse = np.log(np.exp(rows - rows.max(axis=1, keepdims=True)).sum(axis=1)) + rows.max(axis=1)
    ids = np.argsort(-rows, axis=1, kind="stable")[:, :K]
    lp = np.take_along_axis(rows, ids, axis=1) - lse[:, None]
    return ids.astype(np.int32), lp.astype(np.float32)


def greedy(llm, ids):
    llm.reset()
    llm.eval(ids)
    out, margins = [], []
    for _ in range(T):
        row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)
        order = np.argsort(-row, kind="stable")
        out.append(int(order[0]))
        margins.append(float(row[order[0]] - row[order[1]]))
        llm.eval([int(order[0])])
    return np.array(out, np.int32), np.array(margins, np.float32)


def save(path, tensors, metadata):
    """A safetensors file (the format is a JSON header and raw little-endian data)."""
    header, blobs, offset = {"__metadata__": metadata}, [], 0
    for name, arr in tensors.items():
        arr = np.ascontiguousarray(arr)
        dtype = {np.dtype(np.int32): "I32", np.dtype(np.float32): "F32", np.dtype(np.uint8): "U8"}[arr.dtype]
        blob = arr.tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))


def main():
    model, out = sys.argv[1], sys.argv[2]
    GGML_TYPE_F32 = 0
    llm = Llama(model_path=model, n_ctx=1024, n_batch=1024, logits_all=True, n_threads=2, seed=0,
                type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32, verbose=False)
    tensors = {}
    text_ids = llm.tokenize(TEXT.encode(), add_bos=False, special=False)
    llm.reset()
    llm.eval(text_ids)
    logits = np.array(llm.scores[:len(text_ids)], dtype=np.float32)
    top_ids, top_lp = top_k_logprobs(logits)
    tensors["text.utf8"] = np.frombuffer(TEXT.encode(), np.uint8)
    tensors["text.ids"] = np.array(text_ids, np.int32)
    tensors["text.top_ids"], tensors["text.top_lp"] = top_ids, top_lp

    template = llm.metadata["tokenizer.chat_template"]
    env = Environment(trim_blocks=True, lstrip_blocks=True)
    prompts = [(p, False) for p in RAW_PROMPTS] + [(p, True) for p in CHAT_PROMPTS]
    for i, (text, chat) in enumerate(prompts):
        tensors[f"p{i}.text"] = np.frombuffer(text.encode(), np.uint8)
        tensors[f"p{i}.chat"] = np.array([int(chat)], np.int32)
        if chat:
            text = env.from_string(template).render(messages=[{"role": "user", "content": text}],
                                                    add_generation_prompt=True)
        ids = llm.tokenize(text.encode(), add_bos=False, special=chat)
        tensors[f"p{i}.ids"] = np.array(ids, np.int32)
        tensors[f"p{i}.greedy"], tensors[f"p{i}.margin"] = greedy(llm, ids)
        print(f"p{i} ({'chat' if chat else 'raw'}, {len(ids)} tokens): {llm.detokenize(tensors[f'p{i}.greedy'].tolist())!r}")
    meta = {"source": "llama-cpp-python 0.3.36 (llama.cpp), K/V f32", "model": model.split("/")[-1],
            "prompts": json.dumps([p for p, _ in prompts]), "top_k": str(K), "steps": str(T)}
    save(out, tensors, meta)
    print(f"{out}: {len(text_ids)} text tokens, {len(prompts)} prompts")


if __name__ == "__main__":
    main()
