#!/usr/bin/env python3
"""Speculation chat by chat: for each chat of the speculation benchmark (`spec_prompts.py`),
`engine serve` answers with its default n-gram speculation and with `speculative.n_max: 0`,
alternating (which of the two goes first alternates too), greedy, 128 tokens, no prompt cache;
prints per chat the mean t/s of each (each answer's own `timings.predicted_per_second`), their
ratio and every speculative answer's drafted and accepted token counts (`timings.draft_n`,
`draft_n_accepted`). Where `spec-vs-llama.sh` gives a set's mean, this shows which chat gains
and how much of each draft was used.

Usage: bench/spec-per-chat.py ENGINE MODEL [-t THREADS] [-r REPETITIONS] [-n TOKENS]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from spec_prompts import SETS  # noqa: E402
from spec_serve import answer, start_engine  # noqa: E402


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
    proc, port = start_engine(args.engine, args.model, args.threads)
    try:
        print("| set | chat | plain t/s | n-gram t/s | × plain | drafted / accepted per answer |")
        print("| --- | ---: | ---: | ---: | ---: | --- |")
        for name, prompts in SETS.items():
            for i, prompt in enumerate(prompts):
                plain, spec, drafts = [], [], []
                for r in range(args.repetitions):
                    # Which goes first alternates: a request right after another may find the
                    # machine in a different state (warm, or slowed by the prefill before).
                    for spec_first in [r % 2 == 1, r % 2 == 0]:
                        if spec_first:
                            timings = answer(port, prompt, args.tokens, {})
                            spec.append(timings["predicted_per_second"])
                            drafts.append(f"{timings.get('draft_n', 0)}/{timings.get('draft_n_accepted', 0)}")
                        else:
                            plain.append(answer(port, prompt, args.tokens, {"speculative.n_max": 0})["predicted_per_second"])
                p, q = sum(plain) / len(plain), sum(spec) / len(spec)
                ratio = f"{q / p:.2f}" if p > 0 else "-"
                print(f"| {name} | {i + 1} | {p:.1f} | {q:.1f} | {ratio} | {', '.join(drafts)} |", flush=True)
    finally:
        proc.kill()
        proc.wait()


if __name__ == "__main__":
    main()
