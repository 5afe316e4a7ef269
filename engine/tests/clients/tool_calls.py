#!/usr/bin/env python3
"""Tool calling through the `openai` package, as a user writes it, against `engine serve`.

Usage: tool_calls.py BASE_URL (e.g. http://127.0.0.1:8080/v1)

The full loop (tools -> a call -> the tool's result as a `tool` message -> the final answer),
plain and streamed (raw chunks and the package's stream helper), with tool_choice `required`,
a named tool, `auto` and `none`; the legacy `functions`; a schema keyword the engine cannot
follow refused by name. Every call's arguments must parse and satisfy their schema."""
import json
import sys

import openai

client = openai.OpenAI(base_url=sys.argv[1], api_key="unused-on-loopback")
model = client.models.list().data[0].id

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 40},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "unit"],
}
TIME = {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 40}}, "required": ["zone"]}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "description": "The time in a time zone", "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "What is the weather like in Oslo today?"}]
# One call per answer, as agents mostly ask: a small model asked for calls in parallel repeats
# them until the limit (checked on its own below).
COMMON = dict(model=model, temperature=0, max_tokens=160, parallel_tool_calls=False)


def check_arguments(name, text):
    """The arguments parse as JSON and satisfy the tool's schema (the keywords used above)."""
    assert name in SCHEMAS, name
    args = json.loads(text)
    schema = SCHEMAS[name]
    assert isinstance(args, dict), text
    for key in schema["required"]:
        assert key in args, (name, text)
    for key, value in args.items():
        prop = schema["properties"][key]
        if prop["type"] == "string":
            assert isinstance(value, str), (key, text)
            assert len(value) <= prop.get("maxLength", 10**9), (key, text)
            assert "enum" not in prop or value in prop["enum"], (key, text)
        if prop["type"] == "integer":
            assert isinstance(value, int) and prop["minimum"] <= value <= prop["maximum"], (key, text)
    return args


def check_calls(choice):
    assert choice.finish_reason == "tool_calls", choice
    calls = choice.message.tool_calls
    assert calls, choice
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_"), call
        check_arguments(call.function.name, call.function.arguments)
    return calls


def streamed_calls(**kwargs):
    """The calls assembled from raw chunks, as a client without helpers does it."""
    calls, finish, content = {}, None, ""
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for piece in delta.tool_calls or []:
            call = calls.setdefault(piece.index, {"id": None, "name": "", "arguments": ""})
            if piece.id:
                assert call["id"] is None, "the id comes once"
                call["id"] = piece.id
            if piece.function and piece.function.name:
                call["name"] += piece.function.name
            if piece.function and piece.function.arguments:
                call["arguments"] += piece.function.arguments
        finish = chunk.choices[0].finish_reason or finish
    return [calls[i] for i in sorted(calls)], finish, content


# tool_choice "required": plain, then streamed; the same calls (greedy) either way.
reply = client.chat.completions.create(messages=ASK, tools=TOOLS, tool_choice="required", **COMMON)
plain = check_calls(reply.choices[0])
calls, finish, _ = streamed_calls(messages=ASK, tools=TOOLS, tool_choice="required", **COMMON)
assert finish == "tool_calls", finish
assert [(c["name"], json.loads(c["arguments"])) for c in calls] == \
    [(c.function.name, json.loads(c.function.arguments)) for c in plain], (calls, plain)
assert all(c["id"] and c["id"].startswith("call_") for c in calls), calls

# The package's own stream helper assembles the same calls.
stream_helper = getattr(client.chat.completions, "stream", None) or client.beta.chat.completions.stream
with stream_helper(messages=ASK, tools=TOOLS, tool_choice="required", **COMMON) as stream:
    final = stream.get_final_completion()
helped = check_calls(final.choices[0])
assert [c.function.name for c in helped] == [c.function.name for c in plain], (helped, plain)

# A named tool: exactly that one.
named = client.chat.completions.create(
    messages=ASK, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_time"}}, **COMMON)
assert [c.function.name for c in check_calls(named.choices[0])] == ["get_time"], named
assert len(plain) == 1 and len(check_calls(named.choices[0])) == 1, (plain, named)

# Parallel calls allowed: one or more, each valid; cut by the limit, the cut one is no call.
parallel = client.chat.completions.create(
    messages=ASK, tools=TOOLS, tool_choice="required", **{**COMMON, "parallel_tool_calls": True})
c = parallel.choices[0]
assert c.finish_reason in ("tool_calls", "length"), c
for call in c.message.tool_calls or []:
    check_arguments(call.function.name, call.function.arguments)
assert c.message.tool_calls or c.finish_reason == "length", c

# The full loop: the call, the tool's result, the final answer (auto: text, or another call).
first = plain[0]
history = ASK + [
    reply.choices[0].message.model_dump(exclude_none=True),
    {"role": "tool", "tool_call_id": first.id, "content": json.dumps({"temperature": -3, "sky": "snow"})},
]
final = client.chat.completions.create(messages=history, tools=TOOLS, tool_choice="auto", **COMMON)
choice = final.choices[0]
if choice.finish_reason == "tool_calls":
    check_calls(choice)
else:
    assert choice.finish_reason in ("stop", "length"), choice
    assert choice.message.content, choice
    assert not choice.message.tool_calls, choice
calls, finish, content = streamed_calls(messages=history, tools=TOOLS, tool_choice="auto", **COMMON)
assert finish == choice.finish_reason, (finish, choice)
assert content == (choice.message.content or ""), (content, choice)

# auto on a greeting, and none: whatever the model does, it is well formed.
for tool_choice in ("auto", "none"):
    hello = client.chat.completions.create(
        messages=[{"role": "user", "content": "Hello! Who are you?"}], tools=TOOLS, tool_choice=tool_choice, **COMMON)
    c = hello.choices[0]
    if tool_choice == "none":
        assert not c.message.tool_calls and c.finish_reason in ("stop", "length"), c
    elif c.message.tool_calls:
        check_calls(c)

# Legacy functions / function_call.
legacy = client.chat.completions.create(
    messages=ASK, functions=[t["function"] for t in TOOLS], function_call={"name": "get_weather"}, **COMMON)
c = legacy.choices[0]
assert c.finish_reason == "function_call" and c.message.function_call.name == "get_weather", c
check_arguments("get_weather", c.message.function_call.arguments)

# A schema keyword the grammar cannot follow is refused by name.
bad = [{"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"s": {"type": "string", "pattern": "^a"}}}}}]
try:
    client.chat.completions.create(messages=ASK, tools=bad, tool_choice="required", **COMMON)
except openai.BadRequestError as e:
    assert "pattern" in str(e), e
else:
    raise AssertionError("a `pattern` keyword was accepted")
print("tool calls: ok")
