#!/usr/bin/env python3
"""One chat of the speculation benchmark (`spec_prompts.py`) answered by one `engine serve` under
several request settings in rotation (the first is the baseline): greedy, 128 tokens, no prompt
cache, the order rotating from round to round so a slow moment of the machine falls on each
setting alike. Prints each setting's mean t/s (each answer's `timings.predicted_per_second`),
its ratio to the first and its mean drafted tokens. Where `spec-per-chat.py` compares plain and
default speculation, this compares speculation limits: is the planner's choice as good as a
fixed one, and what does a request that never drafts (`speculative.n_min` 16) cost?

Usage: bench/spec-rotate.py ENGINE MODEL CHAT [-t THREADS] [-r ROUNDS] [SETTING ...]
  CHAT     set:index, e.g. quoting:0 or novel:2 (index from 0)
  SETTING  a JSON object of request fields; default: {"speculative.n_max": 0} {}
           {"speculative.n_max": 8} {"speculative.n_max": 4} {"speculative.n_min": 16}
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from spec_prompts import SETS  # noqa: E402
from spec_serve import answer, start_engine  # noqa: E402

TOKENS = 128
DEFAULT_SETTINGS = ['{"speculative.n_max": 0}', "{}", '{"speculative.n_max": 8}', '{"speculative.n_max": 4}',
                    '{"speculative.n_min": 16}']


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("engine")
    ap.add_argument("model")
    ap.add_argument("chat")
    ap.add_argument("settings", nargs="*")
    ap.add_argument("-t", "--threads", default="2")
    ap.add_argument("-r", "--rounds", type=int, default=8)
    args = ap.parse_intermixed_args()
    prompt = chat_prompt(ap, args.chat)
    try:
        settings = [json.loads(s) for s in args.settings or DEFAULT_SETTINGS]
    except json.JSONDecodeError as e:
        ap.error(f"a setting is not JSON: {e}")
    if args.rounds < 1 or not all(isinstance(s, dict) for s in settings):
        ap.error("-r must be at least 1 and each setting a JSON object")
    proc, port = start_engine(args.engine, args.model, args.threads)
    try:
        answer(port, prompt, TOKENS, settings[0])  # warm-up, not counted
        rates = [[] for _ in settings]
        drafted = [[] for _ in settings]
        for r in range(args.rounds):
            k = r % len(settings)
            for i in list(range(k, len(settings))) + list(range(k)):
                timings = answer(port, prompt, TOKENS, settings[i])
                rates[i].append(timings["predicted_per_second"])
                drafted[i].append(timings.get("draft_n", 0))
        base = sum(rates[0]) / len(rates[0])
        print("| setting | t/s | × first | drafted tokens |")
        print("| --- | ---: | ---: | ---: |")
        for setting, r, d in zip(settings, rates, drafted):
            mean = sum(r) / len(r)
            ratio = f"{mean / base:.3f}" if base > 0 else "-"
            print(f"| `{json.dumps(setting)}` | {mean:.1f} | {ratio} | {sum(d) / len(d):.1f} |", flush=True)
    finally:
        proc.kill()
        proc.wait()


def chat_prompt(ap, chat):
    name, _, index = chat.partition(":")
    if name not in SETS or not index.isdigit() or int(index) >= len(SETS[name]):
        sizes = ", ".join(f"{n}:0..{len(p) - 1}" for n, p in SETS.items())
        ap.error(f"no chat {chat!r}; the chats are {sizes}")
    return SETS[name][int(index)]


if __name__ == "__main__":
    main()
