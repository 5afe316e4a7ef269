#!/usr/bin/env bash
# Records the tiny random models' goldens with llama.cpp: writes the models (the ignored test
# tiny_vs_llama::write_tiny_models), then runs record.py --tiny on each (record_mtp.py on a
# target with a draft head, and on Qwen 3.5's own nextn layer). Usage:
# record-tiny.sh [CACHE] [LLAMA_SERVER_ARG ...]   (CACHE as for build-llama.sh)
set -euo pipefail
cd "$(dirname "$0")/../../.."
cache=${1:-${XDG_CACHE_HOME:-$HOME/.cache}/appliance}
shift || true
bin=$(engine/tests/goldens/build-llama.sh "$cache")
models=$(mktemp -d)
trap 'rm -rf "$models"' EXIT
TINY_MODELS_DIR=$models cargo test --release --locked -p engine --test tiny_vs_llama -- \
  --ignored --exact write_tiny_models >&2
for model in "$models"/*.gguf; do
  name=$(basename "$model" .gguf)
  # A draft head runs beside its target: record_mtp.py records what it drafts.
  [[ $name == *-head ]] && continue
  python3 engine/tests/goldens/record.py "$bin" "$model" "$name" engine/tests/goldens --tiny "$@"
  if [ -f "$models/$name-head.gguf" ]; then
    python3 engine/tests/goldens/record_mtp.py "$bin" "$model" "$models/$name-head.gguf" \
      "$name-mtp" engine/tests/goldens
  fi
  # Qwen 3.5 drafts from the nextn layer in its own file.
  if [ "$name" = tiny-qwen35-q4_k_m ]; then
    python3 engine/tests/goldens/record_mtp.py "$bin" "$model" - "$name-mtp" engine/tests/goldens
  fi
done
