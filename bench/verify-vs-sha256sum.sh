#!/usr/bin/env bash
# Verifying a 1 GiB model file from the page cache: `supervisor weights verify` (chunks hashed in
# parallel over a memory map) against `sha256sum` of the same file, in one run, best of 3 each.
# Prints both times and the ratio (sha256sum time / verify time; above 1 means we are faster).
# Usage: bench/verify-vs-sha256sum.sh [SIZE_MIB]   (default 1024)
set -euo pipefail
cd "$(dirname "$0")/.."
size_mib=${1:-1024}
cargo build --release --quiet -p supervisor
bin=target/release/supervisor
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
head -c "$((size_mib * 1024 * 1024))" /dev/urandom > "$work/model.gguf"
"$bin" weights manifest "$work/model.gguf" --id bench > "$work/model.toml"
cat "$work/model.gguf" > /dev/null # into the page cache

best() { # best wall time in seconds of three runs of "$@"
  local best=""
  for _ in 1 2 3; do
    local start end t
    start=$(date +%s.%N)
    "$@" > /dev/null
    end=$(date +%s.%N)
    t=$(echo "$end - $start" | bc -l)
    if [ -z "$best" ] || [ "$(echo "$t < $best" | bc -l)" = 1 ]; then best=$t; fi
  done
  echo "$best"
}

ours=$(best "$bin" --root "$work" --config /dev/null weights verify "$work/model.gguf" --manifest "$work/model.toml")
theirs=$(best sha256sum "$work/model.gguf")
printf 'file: %s MiB from the page cache, %s cores\n' "$size_mib" "$(nproc)"
printf 'supervisor weights verify: %.3f s (%.0f MiB/s)\n' "$ours" "$(echo "$size_mib / $ours" | bc -l)"
printf 'sha256sum:                 %.3f s (%.0f MiB/s)\n' "$theirs" "$(echo "$size_mib / $theirs" | bc -l)"
printf 'ratio (sha256sum / verify): %.2fx\n' "$(echo "$theirs / $ours" | bc -l)"
