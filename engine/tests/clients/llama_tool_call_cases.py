#!/usr/bin/env python3
"""llama.cpp's own tool-call cases that need no particular Hugging Face model
(`tools/server/tests/unit/test_tool_call.py` in llama.cpp 11434: the tiny-model required-tool
cases and `test_completion_without_tool_call_*`), written again here against `engine serve`
with the template the server was started with, plain and streamed.

Usage: llama_tool_call_cases.py BASE_URL (required|without)
  required: a call of the `test` tool (its one argument a constant); without: no call made.
  Its `python` tool is left out of the required cases: a tiny model never ends a free code
  string (llama.cpp leaves it out for Functionary 3.2 for that reason, and keeps all of these
  cases commented out)."""
import json
import sys
import urllib.request

BASE, WHICH = sys.argv[1], sys.argv[2]

TEST_TOOL = {"type": "function", "function": {"name": "test", "description": "", "parameters": {
    "type": "object", "properties": {"success": {"type": "boolean", "const": True}}, "required": ["success"]}}}
PYTHON_TOOL = {"type": "function", "function": {
    "name": "python",
    "description": "Runs code in an ipython interpreter and returns the result of the execution after 60 seconds.",
    "parameters": {"type": "object", "properties": {"code": {
        "type": "string", "description": "The code to run in the ipython interpreter."}}, "required": ["code"]}}}


def chat(body, stream):
    """The answer's first choice, a stream's deltas merged as llama.cpp's test harness merges them."""
    body = {**body, "stream": stream}
    req = urllib.request.Request(f"{BASE}/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        if not stream:
            return json.load(r)["choices"][0]
        message, finish, calls = {"role": "assistant", "content": ""}, None, {}
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if not chunk["choices"]:
                continue
            choice = chunk["choices"][0]
            delta = choice["delta"]
            message["content"] += delta.get("content") or ""
            for piece in delta.get("tool_calls") or []:
                call = calls.setdefault(piece["index"], {"id": "", "type": "function",
                                                         "function": {"name": "", "arguments": ""}})
                call["id"] += piece.get("id") or ""
                function = piece.get("function") or {}
                call["function"]["name"] += function.get("name") or ""
                call["function"]["arguments"] += function.get("arguments") or ""
            finish = choice.get("finish_reason") or finish
        if calls:
            message["tool_calls"] = [calls[i] for i in sorted(calls)]
        return {"message": message, "finish_reason": finish}


def with_required_tool_tiny(tool, argument_key, n_predict, stream):
    choice = chat({
        "max_tokens": n_predict,
        "messages": [{"role": "system", "content": "You are a coding assistant."},
                     {"role": "user", "content": "Write an example"}],
        "tool_choice": "required", "tools": [tool], "parallel_tool_calls": False,
    }, stream)
    tool_calls = choice["message"].get("tool_calls")
    assert tool_calls and len(tool_calls) == 1, f'Expected 1 tool call in {choice["message"]}'
    assert choice["message"].get("content") in (None, ""), f'Expected no content in {choice["message"]}'
    assert len(tool_calls[0].get("id", "")) > 0, f"Expected a non-empty tool call id in {tool_calls[0]}"
    assert tool["function"]["name"] == tool_calls[0]["function"]["name"], choice["message"]
    arguments = json.loads(tool_calls[0]["function"]["arguments"])
    assert argument_key in arguments, f"tool arguments: {arguments}, expected: {argument_key}"


def without_tool_call(n_predict, tools, tool_choice, stream):
    choice = chat({
        "max_tokens": n_predict,
        "messages": [{"role": "system", "content": "You are a coding assistant."},
                     {"role": "user", "content": "say hello world with python"}],
        "tools": tools if tools else None, "tool_choice": tool_choice,
    }, stream)
    assert choice["message"].get("tool_calls") is None, f'Expected no tool call in {choice["message"]}'


for stream in (False, True):
    if WHICH == "required":
        with_required_tool_tiny(TEST_TOOL, "success", 512, stream)
    if WHICH == "without":
        without_tool_call(128, [], None, stream)
        without_tool_call(128, [TEST_TOOL], None, stream)
        without_tool_call(128, [PYTHON_TOOL], "none", stream)
print(f"llama.cpp tool-call cases ({WHICH}): ok")
