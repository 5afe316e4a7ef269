#!/usr/bin/env bash
# Speculative decoding side by side in one run: `engine serve` with n-gram speculation and
# without (per request: the default, or `speculative.n_max: 0`), and llama.cpp's llama-server plain and in
# each of its n-gram modes, on the same model, threads and greedy chats: a quoting set (answer
# by quoting a given document, fill in a given form, edit a given code file) and a novel set
# (open questions). Generation speed is each server's own `timings.predicted_per_second`;
# prints t/s per set and the ratios against plain decoding and against llama.cpp's best mode.
# All servers of a model and thread count run at once, idle but for the one answering, and every
# chat goes to each configuration in turn (the order rotating from chat to chat), for several
# rounds: a slow moment of this machine falls on all configurations alike, not on one. Each
# round starts every server afresh, so no server has seen a chat's answer before: llama.cpp's
# ngram-mod and ngram-cache keep n-grams across requests, and with the same chat again they
# draft its whole greedy answer from memory (125 of 128 tokens accepted in a second round).
#
# Usage: bench/spec-vs-llama.sh [-t 1,2] [-n 128] [-r 2] [MANIFEST ...]
# Cache: $APPLIANCE_CACHE, else ~/.cache/appliance (llama.cpp is built there once).
set -euo pipefail
cd "$(dirname "$0")/.."
threads=1,2 gen=128 rounds=2 manifests=()
while [ $# -gt 0 ]; do
  case "$1" in
    -t) threads=$2; shift 2 ;;
    -n) gen=$2; shift 2 ;;
    -r) rounds=$2; shift 2 ;;
    -h|--help) sed -n 2,14p "$0"; exit 0 ;;
    *) manifests+=("$1"); shift ;;
  esac
done
[ ${#manifests[@]} -gt 0 ] || manifests=(models/smollm2-135m-instruct-q4_1.toml models/gemma3-270m-q4_k_m.toml)
cache=${APPLIANCE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/appliance}
llama_bin=$(engine/tests/goldens/build-llama.sh "$cache")
cargo build --release --locked -p engine -p supervisor >&2
models=()
for manifest in "${manifests[@]}"; do
  models+=("$(basename "$manifest" .toml)=$(target/release/supervisor weights source-path --manifest "$manifest" --cache "$cache")")
done
python3 - "$llama_bin/llama-server" target/release/engine "$threads" "$gen" "$rounds" "${models[@]}" <<'PY'
import json, socket, subprocess, sys, time, urllib.request

llama, engine, threads, gen, rounds = sys.argv[1], sys.argv[2], sys.argv[3].split(","), int(sys.argv[4]), int(sys.argv[5])
models = [m.split("=", 1) for m in sys.argv[6:]]

sys.path.insert(0, "bench")
from spec_prompts import SETS

def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close(); return port

def post(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=900) as r:
        return json.load(r)

def serve(argv, port):
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(1200):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc
        except Exception:
            time.sleep(0.1)
    proc.kill()
    sys.exit(f"{argv[0]} did not become healthy")

MODES = ["ngram-simple", "ngram-map-k", "ngram-mod", "ngram-cache"]

def rate(port, prompt, extra):
    answer = post(port, {"messages": [{"role": "user", "content": prompt}], "max_tokens": gen,
                         "temperature": 0, "cache_prompt": False, **extra})
    return answer["timings"]["predicted_per_second"]

print("| model | threads | set | plain t/s | engine n-gram t/s | × plain | llama.cpp plain t/s | llama.cpp best n-gram t/s (mode) | engine / llama.cpp best |")
print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
def start(path, t):
    """Every configuration's server, freshly started: what one remembers of earlier requests
    (llama.cpp's ngram-mod and ngram-cache keep n-grams across requests) must not include
    the same chat's answer from an earlier round."""
    procs, configs = [], []
    try:
        port = free_port()
        procs.append(serve([engine, "serve", "-m", path, "--port", str(port), "-t", t, "-c", "4096"], port))
        configs += [("plain", port, {"speculative.n_max": 0}), ("engine", port, {})]
        for mode in ["none"] + MODES:
            port = free_port()
            procs.append(serve([llama, "-m", path, "--port", str(port), "-t", t, "-c", "4096", "-np", "1",
                                "--spec-type", mode], port))
            configs.append((mode, port, {}))
    except BaseException:
        stop(procs)
        raise
    return procs, configs

def stop(procs):
    for proc in procs:
        proc.kill(); proc.wait()

for name, path in models:
    for t in threads:
        rates, turn = {}, 0
        for _ in range(rounds):
            procs, configs = start(path, t)
            try:
                for label, _, _ in configs:
                    rates.setdefault(label, {s: [] for s in SETS})
                for s, prompts in SETS.items():
                    for prompt in prompts:
                        order = configs[turn % len(configs):] + configs[:turn % len(configs)]
                        turn += 1
                        for label, port, extra in order:
                            rates[label][s].append(rate(port, prompt, extra))
            finally:
                stop(procs)
        mean = {label: {s: sum(v) / len(v) for s, v in by_set.items()} for label, by_set in rates.items()}
        for s in SETS:
            best_mode = max(MODES, key=lambda m: mean[m][s])
            best = mean[best_mode][s]
            plain, spec = mean["plain"][s], mean["engine"][s]
            print(f"| {name} | {t} | {s} | {plain:.1f} | {spec:.1f} | {spec / plain:.2f} | "
                  f"{mean['none'][s]:.1f} | {best:.1f} ({best_mode}) | {spec / best:.2f} |", flush=True)
PY
