#!/usr/bin/env python3
"""Speculation chat by chat: for each chat of the speculation benchmark (`spec_prompts.py`),
`engine serve` answers with its default n-gram speculation and with `speculative.n_max: 0`,
alternating, greedy, 128 tokens; prints per chat the mean t/s of each (each answer's own
`timings.predicted_per_second`), their ratio and every speculative answer's drafted and
accepted token counts (`timings.draft_n`, `draft_n_accepted`). Where `spec-vs-llama.sh` gives
a set's mean, this shows which chat gains and how much of each draft was used.

Usage: bench/spec-per-chat.py ENGINE MODEL [-t THREADS] [-r REPETITIONS] [-n TOKENS]
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from spec_prompts import SETS  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("engine")
    ap.add_argument("model")
    ap.add_argument("-t", "--threads", default="1")
    ap.add_argument("-r", "--repetitions", type=int, default=3)
    ap.add_argument("-n", "--tokens", type=int, default=128)
    args = ap.parse_args()
    if args.repetitions < 1:
        ap.error("-r must be at least 1")
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    argv = [args.engine, "serve", "-m", args.model, "--port", str(port), "-t", args.threads, "-c", "4096"]
    # The server's log goes to this script's stderr: a model that does not load says why there.
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
    try:
        wait_healthy(port, proc)
        print("| set | chat | plain t/s | n-gram t/s | × plain | drafted / accepted per answer |")
        print("| --- | ---: | ---: | ---: | ---: | --- |")
        for name, prompts in SETS.items():
            for i, prompt in enumerate(prompts):
                plain, spec, drafts = [], [], []
                for _ in range(args.repetitions):
                    plain.append(answer(port, prompt, args.tokens, {"speculative.n_max": 0})["predicted_per_second"])
                    timings = answer(port, prompt, args.tokens, {})
                    spec.append(timings["predicted_per_second"])
                    drafts.append(f"{timings.get('draft_n', 0)}/{timings.get('draft_n_accepted', 0)}")
                p, q = sum(plain) / len(plain), sum(spec) / len(spec)
                ratio = f"{q / p:.2f}" if p > 0 else "-"
                print(f"| {name} | {i + 1} | {p:.1f} | {q:.1f} | {ratio} | {', '.join(drafts)} |", flush=True)
    finally:
        proc.kill()
        proc.wait()


def wait_healthy(port, proc):
    for _ in range(1200):
        if proc.poll() is not None:
            sys.exit(f"engine serve exited with status {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    sys.exit("engine serve did not become healthy")


def answer(port, prompt, tokens, extra):
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": tokens, "temperature": 0, **extra}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=900) as r:
        return json.load(r)["timings"]


if __name__ == "__main__":
    main()
