#!/usr/bin/env python3
"""Records what llama.cpp's Gemma 4 draft head (`--spec-type draft-mtp`) drafts, for the
engine's draft-head test: llama-server runs the target with its head greedily on the tiny
prompt, and its debug log's draft candidates (top 3 of the head's top-10 softmax at each draft
step) are grouped into draft calls. Each call is placed where it drafted from: the index in
the continuation of the token it started after (a call that follows a pass accepting k drafts
starts k + 1 tokens on).

Usage: record_mtp.py LLAMA_BIN_DIR TARGET.gguf HEAD.gguf NAME OUT_DIR
HEAD `-` drafts from the target's own nextn layer (Qwen 3.5). The prompt is the token ids in
prompt.json beside the target; writes OUT_DIR/NAME.json.
"""
import hashlib
import json
import os
import re
import sys
import tempfile

from record import post, start_server

GENERATE = 24
CANDIDATE = re.compile(r"draft candidate\s+(\d+), pos\s+(\d+):\s+(\d+) \(\s*([0-9.]+)\)")


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def main():
    bin_dir, target, head, name, out_dir = sys.argv[1:6]
    with open(os.path.join(os.path.dirname(target), "prompt.json")) as f:
        ids = json.load(f)
    log = tempfile.NamedTemporaryFile(prefix="llama-mtp-", suffix=".log", delete=False)
    own = head == "-"
    draft = [] if own else ["-md", head]
    server, port = start_server(bin_dir, target, draft + ["--spec-type", "draft-mtp", "-lv", "5"], log)
    try:
        result = post(port, "/completion", {"prompt": ids, "n_predict": GENERATE, "temperature": 0.0,
                                            "n_probs": 1, "cache_prompt": False, "samplers": ["top_k"],
                                            "top_k": 1, "ignore_eos": True})
    finally:
        server.kill()
        server.wait()
    tokens = [p["id"] for p in result["completion_probabilities"]]
    calls = []
    with open(log.name, errors="replace") as f:
        for line in f:
            m = CANDIDATE.search(line)
            if not m:
                continue
            k, pos, token, p = int(m[1]), int(m[2]), int(m[3]), float(m[4])
            if k == 0 and pos == 0:
                calls.append([])
            if k == 0:
                calls[-1].append([])
            calls[-1][-1].append([token, p])
    os.unlink(log.name)
    # Where each call starts: after token `at` of the continuation; the drafts it made that the
    # continuation then holds were accepted, and the next call starts after the last of them
    # plus the target's own token.
    placed, at = [], 0
    for steps in calls:
        if at >= len(tokens):
            break
        placed.append({"at": at, "steps": steps})
        drafted = [step[0][0] for step in steps]
        accepted = 0
        while accepted < len(drafted) and at + 1 + accepted < len(tokens) \
                and tokens[at + 1 + accepted] == drafted[accepted]:
            accepted += 1
        at += accepted + 1
    # Drafts past the token limit are cut before they are checked: the log may show more.
    if result["timings"]["draft_n"] > sum(len(c) for c in calls):
        sys.exit(f"the log shows {sum(len(c) for c in calls)} drafted tokens, the answer "
                 f"{result['timings']['draft_n']}")
    golden = {"model": os.path.basename(target), "model_sha256": sha256(target),
              "head": "nextn" if own else os.path.basename(head),
              "head_sha256": sha256(target if own else head), "prompt_tokens": ids,
              "tokens": tokens, "draft_n_accepted": result["timings"]["draft_n_accepted"],
              "calls": placed}
    with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
        json.dump(golden, f)
        f.write("\n")
    print(f"{name}: {len(placed)} draft calls, {result['timings']['draft_n']} drafted, "
          f"{result['timings']['draft_n_accepted']} accepted", file=sys.stderr)


if __name__ == "__main__":
    main()
