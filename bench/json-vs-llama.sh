#!/usr/bin/env bash
# Output constrained to a JSON Schema, the engine against llama.cpp's llama-server side by side
# in one run: both servers on the same model, threads and context, the same greedy requests
# (free text, `json_object`, `json_schema`) alternately, generation speed from each server's own
# `timings` and the wall time per request; prints tokens/s and the ratio engine / llama.cpp.
#
# Usage: bench/json-vs-llama.sh [-t 2] [-n 96] [-r 3] [MANIFEST]
# Cache: $APPLIANCE_CACHE, else ~/.cache/appliance (llama.cpp is built there once).
set -euo pipefail
cd "$(dirname "$0")/.."
threads=2 gen=96 reps=3 manifest=models/smollm2-135m-instruct-q4_1.toml
while [ $# -gt 0 ]; do
  case "$1" in
    -t) threads=$2; shift 2 ;;
    -n) gen=$2; shift 2 ;;
    -r) reps=$2; shift 2 ;;
    -h|--help) sed -n 2,8p "$0"; exit 0 ;;
    *) manifest=$1; shift ;;
  esac
done
cache=${APPLIANCE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/appliance}
llama_bin=$(engine/tests/goldens/build-llama.sh "$cache")
cargo build --release --locked -p engine -p supervisor >&2
model=$(target/release/supervisor weights source-path --manifest "$manifest" --cache "$cache")
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
llama_port=$(port) engine_port=$(port)
"$llama_bin/llama-server" -m "$model" --port "$llama_port" -t "$threads" -c 2048 -np 1 >/dev/null 2>&1 &
llama_pid=$!
target/release/engine serve -m "$model" --port "$engine_port" -t "$threads" -c 2048 >/dev/null 2>&1 &
engine_pid=$!
trap 'kill $llama_pid $engine_pid 2>/dev/null || true' EXIT
python3 - "$llama_port" "$engine_port" "$gen" "$reps" <<'PY'
import json, sys, time, urllib.request
llama_port, engine_port, gen, reps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])

def post(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",
                                 data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    started = time.monotonic()
    with urllib.request.urlopen(req, timeout=600) as r:
        answer = json.load(r)
    return answer, time.monotonic() - started

def wait(port):
    for _ in range(600):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except Exception:
            time.sleep(0.2)
    sys.exit(f"the server on port {port} did not become healthy")

schema = {"type": "object", "properties": {
    "name": {"type": "string"}, "country": {"type": "string"}, "population": {"type": "integer"},
    "landmarks": {"type": "array", "items": {"type": "string"}}},
    "required": ["name", "country", "population", "landmarks"]}
cases = {
    "free text": {},
    "json_object": {"response_format": {"type": "json_object"}},
    "json_schema": {"response_format": {"type": "json_schema", "json_schema": {"name": "city", "schema": schema}}},
}
wait(llama_port); wait(engine_port)
rows = {}
for name, extra in cases.items():
    for rep in range(reps):
        # A different city each repetition, the same one for both servers: no prompt is cached.
        city = ["Paris", "Rome", "Lisbon", "Vienna", "Prague", "Oslo"][rep % 6]
        body = {"messages": [{"role": "user", "content": f"Describe {city} as JSON with its name, country, population and landmarks."}],
                "max_tokens": gen, "temperature": 0, "ignore_eos": False, **extra}
        for tool, port in (("llama", llama_port), ("engine", engine_port)):
            answer, wall = post(port, body)
            choice = answer["choices"][0]
            if name != "free text" and choice["finish_reason"] == "stop":
                json.loads(choice["message"]["content"])  # a finished JSON answer must parse
            t = answer["timings"]
            rows.setdefault(name, {}).setdefault(tool, []).append((t["predicted_per_second"], wall, t["predicted_n"]))
print(f"| request | llama.cpp t/s | engine t/s | engine / llama.cpp | llama.cpp s/request | engine s/request |")
print("| --- | ---: | ---: | ---: | ---: | ---: |")
for name, tools in rows.items():
    avg = lambda xs, i: sum(x[i] for x in xs) / len(xs)
    l, e = tools["llama"], tools["engine"]
    print(f"| {name} | {avg(l, 0):.1f} | {avg(e, 0):.1f} | {avg(e, 0) / avg(l, 0):.2f} | {avg(l, 1):.2f} | {avg(e, 1):.2f} |")
PY
