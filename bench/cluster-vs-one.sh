#!/usr/bin/env bash
# The cost of splitting a model over a cluster, side by side in one run: llama-bench (Debian
# forky's, the build the image carries) on one node, then with its layers split over 2 and 3
# nodes on llama.cpp's RPC backend, each node a network namespace of its own linked by
# WireGuard (wireguard-go) as on the boxes. Prints prompt (pp) and generation (tg) tokens/s and
# the ratio cluster / one node.
#
# Models: Gemma 3 270M (fits one node) and a random model of Gemma 4 E2B's real shapes (about
# 3.5 GB: on 4 GB boards it fits only a cluster). Layers are split evenly over the nodes.
#
# On this machine every node shares the same cores and memory bandwidth, and the link is a
# veth pair: the numbers show what the split itself costs (tensors relayed through the head at
# every stage, RPC round trips, WireGuard), not what separate boards would gain. Needs root.
#
# Usage: bench/cluster-vs-one.sh [-t 1] [-p 128] [-n 32] [-r 3] [--no-e2b]
# Cache: $APPLIANCE_CACHE, else ~/.cache/appliance.
set -euo pipefail
cd "$(dirname "$0")/.."
threads=1 prompt=128 gen=32 reps=3 e2b=yes
while [ $# -gt 0 ]; do
  case "$1" in
    -t) threads=$2; shift 2 ;;
    -p) prompt=$2; shift 2 ;;
    -n) gen=$2; shift 2 ;;
    -r) reps=$2; shift 2 ;;
    --no-e2b) e2b=no; shift ;;
    -h|--help) sed -n 2,16p "$0"; exit 0 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "bench/cluster-vs-one.sh: needs root (network namespaces, chroot)" >&2; exit 2; }
cache=${APPLIANCE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/appliance}
root="$cache/forky-llama"
tests/cluster/forky-llama.sh "$root"
cargo build --release --locked -p supervisor >&2
models=("$(target/release/supervisor weights source-path --manifest models/gemma3-270m-q4_k_m.toml --cache "$cache")")
names=(gemma3-270m-q4_k_m)
if [ "$e2b" = yes ]; then
  if [ ! -f "$cache/e2b-bench/gemma4-e2b-shape-q4_k_m.gguf" ]; then
    mkdir -p "$cache/e2b-bench"
    TINY_MODELS_DIR="$cache/e2b-bench" cargo test --release --locked -p engine --test tiny_vs_llama -- \
      --ignored --exact write_e2b_bench_model >&2
  fi
  models+=("$cache/e2b-bench/gemma4-e2b-shape-q4_k_m.gguf")
  names+=(gemma4-e2b-shape-q4_k_m)
fi

tag="cb$$"
out=$(mktemp -d)
cleanup() {
  for ns in "$tag"h "$tag"a "$tag"b "$tag"lan; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
  rmdir "$root$cache" 2>/dev/null || true
  rm -rf "$out"
}
trap cleanup EXIT
# Debian forky's PROGRAM in its root, the cache bound in at its own path.
forky() { # NS PROGRAM ARGS...
  local ns=$1; shift
  mkdir -p "$root$cache"
  ip netns exec "$ns" unshare --mount -- /bin/sh -c \
    'd=$0 r=$1; shift 1; mount --bind "$d" "$r$d" && exec chroot "$r" "$@"' "$cache" "$root" "$@"
}

# A LAN (a bridge) with the head and two workers, and the link between them.
ip netns add "$tag"lan
ip -n "$tag"lan link add br0 type bridge
ip -n "$tag"lan link set br0 up
i=0
for who in h a b; do
  i=$((i + 1))
  ns="$tag$who"
  ip netns add "$ns"
  ip -n "$ns" link set lo up
  ip link add "$tag${who}0" type veth peer name "$tag${who}1"
  ip link set "$tag${who}0" netns "$ns"
  ip link set "$tag${who}1" netns "$tag"lan
  ip -n "$tag"lan link set "$tag${who}1" master br0 up
  ip -n "$ns" address add "192.168.78.$i/24" dev "$tag${who}0"
  ip -n "$ns" link set "$tag${who}0" up
  (umask 077; wg genkey > "$out/$who.key")
  wg pubkey < "$out/$who.key" > "$out/$who.pub"
  ip netns exec "$ns" wireguard-go "$tag${who}wg" >/dev/null 2>&1
done
i=0
for who in h a b; do
  i=$((i + 1))
  peers=()
  j=0
  for other in h a b; do
    j=$((j + 1))
    [ "$other" = "$who" ] && continue
    peers+=(peer "$(cat "$out/$other.pub")" allowed-ips "10.78.0.$j/32" endpoint "192.168.78.$j:51820")
  done
  ip netns exec "$tag$who" wg set "$tag${who}wg" private-key "$out/$who.key" listen-port 51820 "${peers[@]}"
  ip -n "$tag$who" address add "10.78.0.$i/24" dev "$tag${who}wg"
  ip -n "$tag$who" link set "$tag${who}wg" up
done
rpc=/usr/libexec/x86_64-linux-gnu/llama/bin/ggml-rpc-server
mkdir -p "$cache/rpc-cache"
LLAMA_CACHE="$cache/rpc-cache" forky "$tag"a "$rpc" -H 10.78.0.2 -p 50052 -t "$threads" -c >"$out/rpc-a.log" 2>&1 &
LLAMA_CACHE="$cache/rpc-cache" forky "$tag"b "$rpc" -H 10.78.0.3 -p 50052 -t "$threads" -c >"$out/rpc-b.log" 2>&1 &
for address in 10.78.0.2 10.78.0.3; do
  for _ in $(seq 1 100); do
    ip netns exec "$tag"h python3 -c "import socket; socket.create_connection(('$address', 50052), timeout=1)" 2>/dev/null && break
    sleep 0.2
  done
done

layers() { # MODEL
  python3 - "$1" <<'PY'
import sys
import gguf
r = gguf.GGUFReader(sys.argv[1])
arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
print(int(r.fields[f"{arch}.block_count"].parts[-1][0]))
PY
}
for m in "${!models[@]}"; do
  model=${models[$m]} name=${names[$m]}
  n=$(layers "$model")
  for nodes in 1 2 3; do
    args=()
    if [ "$nodes" -gt 1 ]; then
      # Even thirds (or halves): the head keeps the first share on its CPU, each worker the
      # next; -ngl counts the output layer with the last worker.
      share=$((n / nodes))
      workers=$((nodes - 1))
      offloaded=$((n - share))
      split=""
      servers=""
      for w in $(seq 1 "$workers"); do
        count=$((offloaded / workers))
        [ "$w" = "$workers" ] && count=$((offloaded - (workers - 1) * (offloaded / workers) + 1))
        split="$split${split:+/}$count"
        servers="$servers${servers:+,}10.78.0.$((w + 1)):50052"
      done
      args=(--rpc "$servers" -ngl $((offloaded + 1)) -ts "$split")
    fi
    echo "$name on $nodes node(s) ${args[*]}" >&2
    forky "$tag"h /usr/bin/llama-bench -m "$model" -p "$prompt" -n "$gen" -t "$threads" -r "$reps" \
      "${args[@]}" -o json >"$out/$name.$nodes.json" 2>"$out/$name.$nodes.err" || {
      tail -n 20 "$out/$name.$nodes.err" >&2
      exit 1
    }
  done
done
python3 - "$out" "$prompt" "$gen" "$threads" "${names[@]}" <<'PY'
import json, sys
out, prompt, gen, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
print(f"| model | test | 1 node t/s | 2 nodes t/s | ratio | 3 nodes t/s | ratio |")
print("|---|---|---|---|---|---|---|")
for name in sys.argv[5:]:
    rows = {}
    for nodes in (1, 2, 3):
        for row in json.load(open(f"{out}/{name}.{nodes}.json")):
            test = f"pp{prompt}" if row["n_prompt"] else f"tg{gen}"
            rows[(test, nodes)] = row["avg_ts"]
    for test in (f"pp{prompt}", f"tg{gen}"):
        one = rows[(test, 1)]
        cells = [f"{one:.2f}"]
        for nodes in (2, 3):
            cells += [f"{rows[(test, nodes)]:.2f}", f"{rows[(test, nodes)] / one:.2f}x"]
        print(f"| {name} | {test} t{threads} | " + " | ".join(cells) + " |")
PY
