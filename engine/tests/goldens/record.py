#!/usr/bin/env python3
"""Records llama.cpp goldens for the engine's teacher-forced tests: for each prompt, the prompt's
token ids, the greedy continuation and the top-5 log-probabilities at every generated position,
from llama-server (temperature 0, one slot, no prompt cache).

Usage: record.py LLAMA_BIN_DIR MODEL.gguf NAME OUT_DIR [--tiny] [LLAMA_SERVER_ARG ...]
Prompts are below; NAME prefixes the output files (NAME-PROMPT.json). With --tiny (the random
models of test-support/src/tiny.rs) the one prompt is the token ids in MODEL.prompt.json, else
prompt.json, beside the model;
the golden is NAME.json with the model's SHA-256, and no tokenizer cases are written. Extra
arguments go to
llama-server: recording with another of its configurations (say `-fa off -ctk f32 -ctv f32`)
and comparing with compare.py measures how far llama.cpp moves from itself, the floor for our
tolerances.
"""
import hashlib
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
    # Long and code, past Gemma 3's 512-token sliding window: where small differences have room
    # to grow; exact_forward.py scores the same sequences in float64.
    "code-long": {"chat": [{"role": "user", "content": (
        "Write a complete Python module that parses a CSV file of patient appointments (columns: "
        "date, time, patient_id, clinician, room), validates every field, reports bad rows with "
        "their line numbers, and prints a schedule per clinician sorted by date and time. Include "
        "docstrings, type hints and a main() with argparse."
    )}], "generate": 512},
}
GENERATE = 32
TINY_GENERATE = 40

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


def start_server(bin_dir, model, extra, log=None):
    """llama-server for `model` on a free port (two threads, one slot), once /health answers;
    its output goes to the file `log` when given."""
    port = free_port()
    out = log if log is not None else subprocess.DEVNULL
    server = subprocess.Popen([os.path.join(bin_dir, "llama-server"), "-m", model, "--host", "127.0.0.1",
                               "--port", str(port), "-t", "2", "-c", "4096", "-np", "1", "--no-warmup", *extra],
                              stdout=out, stderr=subprocess.STDOUT if log is not None else subprocess.DEVNULL)
    for _ in range(600):
        if server.poll() is not None:
            sys.exit(f"llama-server exited with {server.returncode} (arguments: {' '.join(extra)})")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                if r.status == 200:
                    return server, port
        except Exception:
            time.sleep(0.2)
    server.kill()
    sys.exit("llama-server did not become healthy in 2 minutes")


def continuation(port, ids, n, cache_prompt=False):
    """llama.cpp's greedy continuation of the token ids and its top-5 log-probabilities."""
    result = post(port, "/completion", {"prompt": ids, "n_predict": n, "temperature": 0.0,
                                        "n_probs": 5, "cache_prompt": cache_prompt, "samplers": ["top_k"],
                                        "top_k": 1, "post_sampling_probs": False, "ignore_eos": True})
    probs = result["completion_probabilities"]
    # llama-server reports no probabilities for a token that ends inside a UTF-8 character: a
    # golden with a gap would compare the wrong positions.
    if len(probs) != result["tokens_predicted"]:
        sys.exit(f"{result['tokens_predicted']} tokens generated but {len(probs)} with probabilities")
    return {"tokens": [p["id"] for p in probs],
            "top": [[[t["id"], t["logprob"]] for t in p["top_logprobs"]] for p in probs]}


def main():
    bin_dir, model, name, out_dir = sys.argv[1:5]
    extra = sys.argv[5:]
    tiny = extra[:1] == ["--tiny"]
    if tiny:
        extra = extra[1:]
    server, port = start_server(bin_dir, model, extra)
    try:
        if tiny:
            # A model's own prompt (a recurrent one's is long) where the generator wrote one.
            own = model[:-len(".gguf")] + ".prompt.json"
            with open(own if os.path.exists(own) else os.path.join(os.path.dirname(model), "prompt.json")) as f:
                ids = json.load(f)
            with open(model, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
            golden = {"model": os.path.basename(model), "model_sha256": digest, "prompt_tokens": ids,
                      **continuation(port, ids, TINY_GENERATE)}
            with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
                json.dump(golden, f)
                f.write("\n")
            print(f"{name}: {len(ids)} prompt tokens, {len(golden['tokens'])} generated", file=sys.stderr)
            return
        for key, prompt in PROMPTS.items():
            if "chat" in prompt:
                text = post(port, "/apply-template", {"messages": prompt["chat"]})["prompt"]
            else:
                text = prompt["raw"]
            ids = post(port, "/tokenize", {"content": text, "add_special": True, "parse_special": True})["tokens"]
            golden = {
                "model": os.path.basename(model),
                "prompt": text,
                "prompt_tokens": ids,
                **continuation(port, ids, prompt.get("generate", GENERATE)),
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
