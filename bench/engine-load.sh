#!/usr/bin/env bash
# `engine serve` under load: builds the release engine, starts it on the model a manifest names
# (fetched through the manifest's pip source into the cache), then runs bench/engine-load.py for
# each client count and prints one Markdown row per run: answers/s, completion tokens/s, the
# share of 503 answers, connection errors and the p50/p99 latency. Reports, never asserts.
#
# Usage: bench/engine-load.sh [-c 1,4,16] [-d 30] [-n 8] [-t 2] [--queue 8] [--half-open 0]
#        [--engine BIN] [MANIFEST]
# --engine: another build of the engine to load instead (e.g. an older commit's, to compare).
# Cache: $APPLIANCE_CACHE, else ~/.cache/appliance.
set -euo pipefail
cd "$(dirname "$0")/.."
clients=1,4,16 seconds=30 tokens=8 threads=2 queue=8 half_open=0
manifest=models/smollm2-135m-instruct-q4_1.toml engine_bin=target/release/engine
while [ $# -gt 0 ]; do
  case "$1" in
    -c) clients=$2; shift 2 ;;
    -d) seconds=$2; shift 2 ;;
    -n) tokens=$2; shift 2 ;;
    -t) threads=$2; shift 2 ;;
    --queue) queue=$2; shift 2 ;;
    --half-open) half_open=$2; shift 2 ;;
    --engine) engine_bin=$2; shift 2 ;;
    -h|--help) sed -n 2,11p "$0"; exit 0 ;;
    *) manifest=$1; shift ;;
  esac
done
cache=${APPLIANCE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/appliance}
cargo build --release --locked -p engine -p supervisor >&2
model=$(target/release/supervisor weights source-path --manifest "$manifest" --cache "$cache")
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$engine_bin" serve -m "$model" --port "$port" -t "$threads" -c 512 --queue "$queue" \
  2>/dev/null &
engine=$!
trap 'kill "$engine" 2>/dev/null; wait "$engine" 2>/dev/null || true' EXIT
until curl -sf "http://127.0.0.1:$port/health" >/dev/null; do
  kill -0 "$engine" || { echo "engine serve exited" >&2; exit 1; }
  sleep 0.2
done
echo "| clients | half-open held | s | answers/s | tokens/s | 503 share | conn. errors | p50 ms (200) | p99 ms (200) | p99 ms (all) |"
echo "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
for n in ${clients//,/ }; do
  python3 bench/engine-load.py --port "$port" --clients "$n" --seconds "$seconds" \
    --max-tokens "$tokens" --half-open "$half_open" --json |
    python3 -c 'import json, sys; r = json.load(sys.stdin); print("| {clients} | {half_open_held} | {seconds} | {answers_per_s} | {completion_tokens_per_s} | {share_503} | {connection_errors} | {p50_ms_200} | {p99_ms_200} | {p99_ms_all} |".format(**r))'
done
