#!/usr/bin/env python3
"""How much n-gram speculation can gain on this machine, at best: the limit the planner works
against, from the measured pass costs and the model's own greedy answers.

For each chat of the speculation benchmark (`spec_prompts.py`) it takes the greedy answer
(`engine generate --spec none`), then replays decoding with the engine's lookup (the earlier
occurrence agreeing with the longest suffix, 2 to 64 tokens, as `engine/src/speculate.rs`
drafts) under a planner that knows in advance how many drafted tokens will be accepted and
drafts exactly those (when the pass pays for itself). Pass costs relative to one step come
from `engine bench --batch` on the same threads (passes timed back to back, as decoding runs
them). It prints, per set, that bound as a speed-up
over plain decoding: what no planner using this lookup can beat on these answers and costs.
With `--replay`, it also replays the same answers and costs through the planner as built
(`engine/examples/spec_replay.rs`): the share of the bound the planner gets, free of the
machine's noise that a served benchmark carries.

Usage: bench/spec-bound.py ENGINE MODEL [-t THREADS] [-n 128] [-d 64] [--chats bench|held-out] [--replay]
(`-d`: positions already in the cache when the pass costs are timed, as `engine bench -d`; the
quoting chats' answers start 118–262 positions in and run 128 more. `--chats held-out`: the
sets the planner was not tuned on, `spec_prompts.HELD_OUT`.)
(`--replay` builds the example: `cargo build --release -p engine --example spec_replay`)
"""
import argparse
import json
import subprocess
import sys

sys.path.insert(0, "bench")
from spec_prompts import HELD_OUT, SETS  # noqa: E402

MAX_DRAFT = 16
MATCH_MAX = 64


def lookup(history, n):
    """The tokens after the earlier occurrence agreeing with the longest suffix (the most
    recent among equals, a longer continuation first), as `speculate::draft` chooses them."""
    best, best_key = [], (0, 0)
    last = history[-1]
    for end in range(len(history) - 2, -1, -1):
        if history[end] != last:
            continue
        matched = 0
        while matched < min(MATCH_MAX, end + 1) and history[end - matched] == history[-1 - matched]:
            matched += 1
        tokens = history[end + 1:end + 1 + n]
        if matched >= 2 and (matched, len(tokens)) > best_key:
            best, best_key = tokens, (matched, len(tokens))
            if matched == MATCH_MAX and len(tokens) == n:
                break
    return best


def bound(prompt, answer, cost):
    """Plain steps over the cost of decoding `answer` with perfectly sized drafts."""
    i, spent = 1, 0.0
    while i < len(answer):
        draft = lookup(prompt + answer[:i], min(MAX_DRAFT, len(answer) - i - 1))
        accepted = 0
        while accepted < len(draft) and draft[accepted] == answer[i + accepted]:
            accepted += 1
        if accepted and (accepted + 1) / cost[accepted] <= 1:
            accepted = 0
        spent += cost[accepted]
        i += accepted + 1
    return (len(answer) - 1) / spent


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("engine")
    ap.add_argument("model")
    ap.add_argument("-t", "--threads", default="1")
    ap.add_argument("-n", "--n-predict", type=int, default=128)
    ap.add_argument("-d", "--depth", type=int, default=64,
                    help="positions in the cache when pass costs are timed (engine bench -d; 64 at least)")
    ap.add_argument("--chats", choices=["bench", "held-out"], default="bench",
                    help="the benchmark's chats, or the held-out ones the planner was not tuned on")
    ap.add_argument("--replay", action="store_true", help="also replay through the planner as built")
    args = ap.parse_args()
    sets = SETS if args.chats == "bench" else HELD_OUT
    replay = None
    if args.replay:
        subprocess.run(["cargo", "build", "--release", "--locked", "-p", "engine", "--example", "spec_replay"],
                       check=True, stdout=sys.stderr)
        replay = "target/release/examples/spec_replay"
    widths = list(range(1, MAX_DRAFT + 2))
    rows = json.loads(subprocess.run(
        [args.engine, "bench", "-m", args.model, "-p", "0", "-n", "0", "-t", args.threads, "-r", "5",
         "-d", str(args.depth), "--batch", ",".join(map(str, widths)), "--json"],
        check=True, capture_output=True, text=True).stdout)
    ms = {row["n_batch"]: row["avg_ms"] for row in rows if row.get("n_batch")}
    cost = [ms[m] / ms[1] for m in widths]
    print(f"pass costs (steps) for 2, 4, 8, 16 tokens: {cost[1]:.2f}, {cost[3]:.2f}, {cost[7]:.2f}, {cost[15]:.2f}")
    for name, prompts in sets.items():
        gains, chats = [], []
        for prompt in prompts:
            out = json.loads(subprocess.run(
                [args.engine, "generate", "-m", args.model, "--chat", "-p", prompt, "-n", str(args.n_predict),
                 "--temp", "0", "--spec", "none", "-t", args.threads, "--json"],
                check=True, capture_output=True, text=True).stdout)
            gains.append(bound(out["prompt_tokens"], out["tokens"], cost))
            chats.append({"prompt": out["prompt_tokens"], "answer": out["tokens"]})
        print(f"{name}: at most {sum(gains) / len(gains):.2f}x plain ({', '.join(f'{g:.2f}' for g in gains)})")
        if replay:
            lines = subprocess.run([replay], input=json.dumps({"cost": cost, "chats": chats}),
                                   check=True, capture_output=True, text=True).stdout.splitlines()
            got = [json.loads(line)["speedup"] for line in lines]
            print(f"{name}: the planner as built {sum(got) / len(got):.2f}x plain ({', '.join(f'{g:.2f}' for g in got)})")


if __name__ == "__main__":
    main()
