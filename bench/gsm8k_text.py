#!/usr/bin/env python3
"""GSM8K's training split (../shared/data/gsm8k.train.jsonl, MIT) as plain
text for `polar perplexity` and llama.cpp's llama-perplexity: each question,
then its worked answer without the dataset's <<calculator>> annotations, a
blank line between items, runs of spaces as one (llama.cpp's SmolLM
pre-tokenizer splits digits off first, so a run of spaces before a digit
tokenizes otherwise than in Hugging Face's tokenizer and polar's; one space
keeps the two comparable). Nothing is fetched.

    python3 bench/gsm8k_text.py [--data FILE] [--first I] [--count N] -o OUT.txt
"""
import argparse
import json
import re
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="../shared/data/gsm8k.train.jsonl")
    ap.add_argument("--first", type=int, default=0, help="the first item (0-based)")
    ap.add_argument("--count", type=int, default=0, help="items to write (0: to the end)")
    ap.add_argument("-o", required=True, help="the text file to write")
    a = ap.parse_args()
    items = []
    with open(a.data, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i < a.first or (a.count and len(items) == a.count):
                continue
            item = json.loads(line)
            answer = re.sub(r"<<[^>]*>>", "", item["answer"])
            text = f"Question: {item['question'].strip()}\nAnswer: {answer.strip()}\n"
            items.append(re.sub(r"[ \t]+", " ", text))
    with open(a.o, "w", encoding="utf-8") as f:
        f.write("\n".join(items))
    print(f"{a.o}: {len(items)} items from {a.data} (from item {a.first})", file=sys.stderr)


if __name__ == "__main__":
    main()
