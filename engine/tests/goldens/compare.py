#!/usr/bin/env python3
"""Compares two recordings of the same prompt (record.py output, e.g. llama.cpp in two
configurations): at every generated position up to the first differing greedy token, the mean
and max |Δ logprob| over the first file's top tokens that both files list.

Usage: compare.py A.json B.json
"""
import json
import sys


def main():
    a, b = (json.load(open(p)) for p in sys.argv[1:3])
    worst_mean = worst_max = 0.0
    for i, (ta, tb, pa, pb) in enumerate(zip(a["tokens"], b["tokens"], a["top"], b["top"])):
        listed = dict((t[0], t[1]) for t in pb)
        deltas = [abs(listed[t[0]] - t[1]) for t in pa if t[0] in listed]
        mean, peak = sum(deltas) / len(deltas), max(deltas)
        worst_mean, worst_max = max(worst_mean, mean), max(worst_max, peak)
        print(f"position {i}: mean {mean:.3f} max {peak:.3f} tokens {ta} {tb}")
        if ta != tb:
            break
    print(f"worst mean {worst_mean:.3f}, worst max {worst_max:.3f}")


if __name__ == "__main__":
    main()
