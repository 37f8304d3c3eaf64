#!/usr/bin/env python3
"""The official `openai` Python client against a running `polar serve`:
models, completions, chat, streaming, n, stop, seeds, log-probabilities,
polar's program field, and errors as the client's exceptions; each greedy
answer compared with `polar run`'s for the same prompt and program. Prints
PASS/FAIL lines; exit status 1 when any fails. bench/serve_openai.sh starts
the server and installs the client into a virtualenv first.

    python3 bench/serve_openai.py --url http://127.0.0.1:8080/v1 --api-key KEY --polar build/polar
"""
import argparse
import json
import subprocess
import sys

import openai

QUESTION = "What is the capital of France? Answer in one sentence."
PROGRAM = "0-23,20-26,28-29"
failed = 0


def check(name, ok, why=""):
    global failed
    print("%s openai_%s%s" % ("PASS" if ok else "FAIL", name, "" if ok else ": " + why))
    failed += not ok


def polar_run(polar, *args):
    out = subprocess.run([polar, "run", "--json", *args], capture_output=True, text=True, check=True).stdout
    return json.loads(out)["text"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True, help="the server's base URL, ending in /v1")
    ap.add_argument("--api-key", default="none")
    ap.add_argument("--polar", default="build/polar")
    a = ap.parse_args()
    client = openai.OpenAI(base_url=a.url, api_key=a.api_key, max_retries=0, timeout=120)

    models = client.models.list()
    model = models.data[0].id
    check("models", len(models.data) == 1 and models.data[0].object == "model", str(models))

    want = polar_run(a.polar, "--prompt", QUESTION, "--max-new", "24")
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": QUESTION}],
                                       temperature=0, max_tokens=24)
    check("chat_greedy", r.choices[0].message.content == want and r.usage.completion_tokens > 0,
          "%r vs polar run %r" % (r.choices[0].message.content, want))
    chat_text = r.choices[0].message.content

    want = polar_run(a.polar, "--prompt", QUESTION, "--max-new", "24", "--program", PROGRAM)
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": QUESTION}],
                                       temperature=0, max_tokens=24, extra_body={"program": PROGRAM})
    check("chat_program", r.choices[0].message.content == want and r.choices[0].model_extra.get("program") == PROGRAM,
          "%r vs polar run %r (%s)" % (r.choices[0].message.content, want, r.choices[0].model_extra))

    want = polar_run(a.polar, "--raw", "--prompt", "The capital of France is", "--max-new", "12")
    r = client.completions.create(model=model, prompt="The capital of France is", temperature=0, max_tokens=12)
    check("completion_greedy", r.choices[0].text == want, "%r vs polar run %r" % (r.choices[0].text, want))

    stream = client.chat.completions.create(model=model, messages=[{"role": "user", "content": QUESTION}],
                                            temperature=0, max_tokens=24, stream=True,
                                            stream_options={"include_usage": True})
    pieces, finish, usage = [], None, None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            pieces.append(c.delta.content or "")
            finish = c.finish_reason or finish
    check("chat_stream", "".join(pieces) == chat_text and finish == "stop" and usage is not None,
          "%r vs %r, finish %s, usage %s" % ("".join(pieces), chat_text, finish, usage))

    pieces = [c.choices[0].text for c in client.completions.create(
        model=model, prompt="The capital of France is", temperature=0, max_tokens=12, stream=True)]
    check("completion_stream", "".join(pieces) == want, "%r vs %r" % ("".join(pieces), want))

    r = client.completions.create(model=model, prompt="The capital of France is", temperature=0, max_tokens=12,
                                  stop=["\n"])
    check("stop", r.choices[0].text == want.split("\n")[0] and r.choices[0].finish_reason == "stop", str(r.choices[0]))

    def sampled():
        r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Write a haiku."}],
                                           temperature=1.0, top_p=0.95, seed=11, n=3, max_tokens=20)
        return [c.message.content for c in sorted(r.choices, key=lambda c: c.index)]
    s1, s2 = sampled(), sampled()
    check("n_seed", len(s1) == 3 and s1 == s2 and len(set(s1)) > 1, "%r then %r" % (s1, s2))

    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": QUESTION}], temperature=0,
                                       max_tokens=4, logprobs=True, top_logprobs=3)
    lp = r.choices[0].logprobs.content
    check("logprobs", len(lp) == 4 and all(len(t.top_logprobs) == 3 and t.logprob <= 0 and
                                           t.token == t.top_logprobs[0].token for t in lp), str(lp))

    def raises(name, exc, call, param=None):
        try:
            call()
            check(name, False, "no error")
        except exc as e:
            got = (e.body or {}).get("param") if isinstance(e.body, dict) else None
            check(name, param is None or got == param, "param %r, want %r: %s" % (got, param, e))
        except Exception as e:  # noqa: BLE001 - any other is the failure reported
            check(name, False, "%s: %s" % (type(e).__name__, e))
    raises("wrong_type", openai.BadRequestError, lambda: client.completions.create(
        model=model, prompt="x", max_tokens=4, extra_body={"top_k": "many"}), "top_k")
    raises("bad_program", openai.BadRequestError, lambda: client.completions.create(
        model=model, prompt="x", max_tokens=4, extra_body={"program": "0-99"}), "program")
    raises("unknown_model", openai.NotFoundError, lambda: client.completions.create(model="gpt-5", prompt="x"), "model")
    if a.api_key != "none":
        bad = openai.OpenAI(base_url=a.url, api_key="wrong", max_retries=0)
        raises("wrong_key", openai.AuthenticationError, lambda: bad.models.list())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
