#!/usr/bin/env python3
"""Scores a golden's own token sequence with llama.cpp in another configuration, teacher-forced:
at every generated position, llama-server's top-5 log-probabilities after the prompt and the
golden's tokens so far (one new token per request, the rest from its prompt cache). The output
has the golden's shape, so compare.py measures llama.cpp's spread against itself over every
position, not only up to where two free-running recordings part.

Usage: teacher_forced.py LLAMA_BIN_DIR MODEL.gguf GOLDEN.json OUT.json [LLAMA_SERVER_ARG ...]
"""
import json
import sys

from record import post, start_server


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
            result = post(port, "/completion", {"prompt": sequence, "n_predict": 1, "temperature": 0.0,
                                                "n_probs": 5, "cache_prompt": True, "samplers": ["top_k"],
                                                "top_k": 1, "post_sampling_probs": False, "ignore_eos": True})
            probs = result["completion_probabilities"][0]
            top.append([[t["id"], t["logprob"]] for t in probs["top_logprobs"]])
            sequence.append(token)
        with open(out_path, "w") as f:
            json.dump({**golden, "top": top}, f)
            f.write("\n")
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
