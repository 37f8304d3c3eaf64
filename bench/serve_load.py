#!/usr/bin/env python3
"""Load on a running `polar serve`: many concurrent streaming clients, each
sending requests one after another with mixed programs; then every distinct
greedy request once more, alone, and its answer compared with each answer it
got under load (none lost, none mixed up). Reports time to first token (p50,
p99), tokens/s served, and writes the numbers as JSON with -o.

    polar serve --max-batch 32 &
    python3 bench/serve_load.py --url http://127.0.0.1:8080 --clients 64 --requests 10

Standard library only (http.client, threads). Not part of make test.
"""
import argparse
import http.client
import json
import statistics
import sys
import threading
import time
import urllib.parse

# Questions of different lengths, so sequences join and leave at different steps.
PROMPTS = [
    "What is the capital of France? Answer in one sentence.",
    "Write a haiku about the sea.",
    "Tom has 3 apples and buys 2 more. How many apples does he have?",
    "List three primary colors.",
    "Explain in two sentences why the sky is blue.",
    "What is 12 times 7?",
    "Name a mammal that can fly.",
    "Give me a synonym for happy.",
    "Translate 'good morning' into Spanish.",
    "What does a thermometer measure?",
    "Who wrote Romeo and Juliet?",
    "Describe a cat in five words.",
    "What is the boiling point of water in Celsius?",
    "Suggest a name for a goldfish.",
    "How many days are in a leap year?",
    "What color do you get by mixing blue and yellow?",
]


def percentile(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


class Client:
    def __init__(self, url, api_key, timeout):
        u = urllib.parse.urlparse(url)
        self.host, self.port = u.hostname, u.port or 80
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = "Bearer " + api_key
        self.timeout = timeout

    def chat(self, body):
        """One request; streamed: (text, time to first token, completion tokens, seconds)."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        t0 = time.perf_counter()
        conn.request("POST", "/v1/chat/completions", json.dumps(body), self.headers)
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError("HTTP %d: %s" % (resp.status, resp.read()[:300]))
        if not body.get("stream"):
            r = json.loads(resp.read())
            conn.close()
            return r["choices"][0]["message"]["content"], None, r["usage"]["completion_tokens"], time.perf_counter() - t0
        text, ttft, tokens, done = [], None, 0, False
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                done = True
                break
            ev = json.loads(data)
            if "error" in ev:
                raise RuntimeError("error event: %s" % ev["error"]["message"])
            if ev.get("usage"):
                tokens = ev["usage"]["completion_tokens"]
            for ch in ev["choices"]:
                piece = ch["delta"].get("content") or ""
                if piece and ttft is None:
                    ttft = time.perf_counter() - t0
                text.append(piece)
        conn.close()
        if not done:
            raise RuntimeError("the stream ended without [DONE]")
        return "".join(text), ttft, tokens, time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--api-key")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--requests", type=int, default=10, help="requests per client, one after another")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--ignore-eos", action="store_true", help="every answer exactly --max-tokens long")
    ap.add_argument("--programs", default="base;0-23,20-26,28-29;0-13,15-29",
                    help="programs the requests take in turn, separated by ';' (default: base and two of the "
                         "default model's)")
    ap.add_argument("--no-check", action="store_true", help="skip the answers' check against each request alone")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("-o", "--output", help="the results as JSON")
    a = ap.parse_args()
    programs = a.programs.split(";")
    client = Client(a.url, a.api_key, a.timeout)

    def body(i, j, stream):
        k = i * a.requests + j
        b = {"messages": [{"role": "user", "content": PROMPTS[k % len(PROMPTS)]}], "max_tokens": a.max_tokens,
             "temperature": 0, "program": programs[k % len(programs)], "stream": stream}
        if stream:
            b["stream_options"] = {"include_usage": True}
        if a.ignore_eos:
            b["ignore_eos"] = True
        return b

    results, errors, lock = {}, [], threading.Lock()

    def run(i):
        for j in range(a.requests):
            try:
                r = client.chat(body(i, j, True))
                with lock:
                    results[(i, j)] = r
            except Exception as e:  # noqa: BLE001 - every failure is reported
                with lock:
                    errors.append("client %d request %d: %s" % (i, j, e))

    t0 = time.perf_counter()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ttft = [r[1] for r in results.values() if r[1] is not None]
    tokens = sum(r[2] for r in results.values())
    out = {"clients": a.clients, "requests": a.clients * a.requests, "answered": len(results), "errors": len(errors),
           "max_tokens": a.max_tokens, "ignore_eos": a.ignore_eos, "programs": programs,
           "wall_s": round(wall, 3), "completion_tokens": tokens, "tokens_per_s": round(tokens / wall, 2),
           "ttft_p50_ms": round(1000 * percentile(ttft, 50), 1), "ttft_p99_ms": round(1000 * percentile(ttft, 99), 1),
           "latency_p50_s": round(percentile([r[3] for r in results.values()], 50), 3)}
    if not a.no_check:
        # each distinct request once, alone and not streamed: the answer every copy under load must equal
        alone, mismatched = {}, []
        for (i, j), r in sorted(results.items()):
            b = body(i, j, False)
            key = (b["messages"][0]["content"], b["program"])
            if key not in alone:
                alone[key] = client.chat(b)[0]
            if r[0] != alone[key]:
                mismatched.append("client %d request %d (%s): %r under load, %r alone" % (i, j, key[1], r[0], alone[key]))
        out["checked_distinct"], out["mismatched"] = len(alone), len(mismatched)
        errors += mismatched
    for e in errors[:10]:
        print("error:", e, file=sys.stderr)
    print("%d clients x %d requests: %d answered, %d errors%s; %.1f s, %d tokens, %.1f tokens/s; "
          "time to first token p50 %.1f ms, p99 %.1f ms" %
          (a.clients, a.requests, out["answered"], out["errors"],
           "" if a.no_check else ", %d mismatched of %d distinct" % (out["mismatched"], out["checked_distinct"]),
           wall, tokens, out["tokens_per_s"], out["ttft_p50_ms"], out["ttft_p99_ms"]))
    if a.output:
        with open(a.output, "w") as f:
            json.dump(out, f, indent=1)
            f.write("\n")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
