#!/usr/bin/env python3
"""Records llama.cpp goldens for the engine's teacher-forced tests: for each prompt, the prompt's
token ids, the greedy continuation and the top-5 log-probabilities at every generated position,
from llama-server (temperature 0, one slot, no prompt cache).

Usage: record.py LLAMA_BIN_DIR MODEL.gguf NAME OUT_DIR [LLAMA_SERVER_ARG ...]
Prompts are below; NAME prefixes the output files (NAME-PROMPT.json). Extra arguments go to
llama-server: recording with another of its configurations (say `-fa off -ctk f32 -ctv f32`)
and comparing with compare.py measures how far llama.cpp moves from itself, the floor for our
tolerances.
"""
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

PROMPTS = {
    "raw-short": {"raw": "The capital of France is"},
    "chat-short": {"chat": [{"role": "user", "content": "Name three primary colours."}]},
    "raw-long": {"raw": (
        "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
        "combined movable metal type, oil-based ink and a screw press adapted from wine making. "
    ) * 14 + "In summary, the printing press"},
}
GENERATE = 32

# Tokenizer corpus: code, Greek, Chinese, emoji, whitespace runs, numbers, special tokens.
CORPUS = [
    "fn main() {\n    println!(\"{}\", 1 + 2);\n}\n",
    "def f(x):\n\treturn x**2  # square\n",
    "Καλημέρα κόσμε, τι κάνεις;",
    "北京欢迎你。我们在学习机器学习。",
    "Emoji 🙂🚀 and ZWJ 👩‍💻 family 👨‍👩‍👧",
    "spaces:   three,      six\n\n\nnewlines\r\nwindows",
    "Numbers 3.14159, 1,000,000 and 2026-11-29; 0x1F; 42nd",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>",
    "Don't won't I'm we'll they've she'd it's",
    "   leading and trailing   ",
    "MiXeD CaSe ÀÉÎÕÜ ß ﬁ",
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


def main():
    bin_dir, model, name, out_dir = sys.argv[1:5]
    extra = sys.argv[5:]
    port = free_port()
    server = subprocess.Popen([os.path.join(bin_dir, "llama-server"), "-m", model, "--host", "127.0.0.1",
                               "--port", str(port), "-t", "2", "-c", "4096", "-np", "1", "--no-warmup", *extra],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except Exception:
                time.sleep(0.2)
        for key, prompt in PROMPTS.items():
            if "chat" in prompt:
                text = post(port, "/apply-template", {"messages": prompt["chat"]})["prompt"]
            else:
                text = prompt["raw"]
            ids = post(port, "/tokenize", {"content": text, "add_special": True, "parse_special": True})["tokens"]
            result = post(port, "/completion", {"prompt": ids, "n_predict": GENERATE, "temperature": 0.0,
                                                "n_probs": 5, "cache_prompt": False, "samplers": ["top_k"],
                                                "top_k": 1, "post_sampling_probs": False})
            probs = result["completion_probabilities"]
            golden = {
                "model": os.path.basename(model),
                "prompt": text,
                "prompt_tokens": ids,
                "tokens": [p["id"] for p in probs],
                "top": [[[t["id"], t["logprob"]] for t in p["top_logprobs"]] for p in probs],
            }
            with open(os.path.join(out_dir, f"{name}-{key}.json"), "w") as f:
                json.dump(golden, f)
                f.write("\n")
            print(f"{name}-{key}: {len(ids)} prompt tokens, {len(golden['tokens'])} generated", file=sys.stderr)
        cases = []
        for text in CORPUS:
            for special in (False, True):
                ids = post(port, "/tokenize", {"content": text, "add_special": True, "parse_special": special})["tokens"]
                cases.append({"text": text, "special": special, "ids": ids})
        with open(os.path.join(out_dir, f"{name}-tokenizer.json"), "w") as f:
            json.dump(cases, f)
            f.write("\n")
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
