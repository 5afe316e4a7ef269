#!/usr/bin/env python3
"""Scores a golden's own token sequence with llama.cpp in another configuration, teacher-forced:
at every generated position, llama-server's top-5 log-probabilities after the prompt and the
golden's tokens so far (one new token per request, the rest from its prompt cache where it
keeps one: for Gemma 3's sliding-window cache it processes the whole sequence again, so even its
default configuration moves against its own recording). The output
has the golden's shape, so compare.py measures llama.cpp's spread against itself over every
position, not only up to where two free-running recordings part.

Usage: teacher_forced.py LLAMA_BIN_DIR MODEL.gguf GOLDEN.json OUT.json [LLAMA_SERVER_ARG ...]
"""
import json
import sys

from record import continuation, start_server


def main():
    bin_dir, model, golden_path, out_path = sys.argv[1:5]
    extra = sys.argv[5:]
    with open(golden_path) as f:
        golden = json.load(f)
    server, port = start_server(bin_dir, model, extra)
    try:
        sequence = list(golden["prompt_tokens"])
        top = []
        for token in golden["tokens"]:
            top.extend(continuation(port, sequence, 1, cache_prompt=True)["top"])
            sequence.append(token)
        with open(out_path, "w") as f:
            json.dump({**golden, "top": top}, f)
            f.write("\n")
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
