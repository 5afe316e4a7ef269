#!/usr/bin/env python3
"""The `openai` package's Responses API (`client.responses.create`) against `engine serve`:
plain, streamed with its typed events, a conversation carrying a past call and its output,
and what cannot be served refused. Usage: responses_client.py BASE_URL (…/v1)."""
import json
import sys

import openai

client = openai.OpenAI(base_url=sys.argv[1], api_key="unused-on-loopback")
model = client.models.list().data[0].id
asked = dict(model=model, instructions="Answer in one short sentence.",
             input="What is the capital of France?", max_output_tokens=24, temperature=0)

# The same greedy answer as a chat with the instructions as its system message.
chat = client.chat.completions.create(
    model=model, max_tokens=24, temperature=0,
    messages=[{"role": "system", "content": asked["instructions"]},
              {"role": "user", "content": asked["input"]}])
reply = client.responses.create(**asked)
assert reply.id.startswith("resp_"), reply.id
assert reply.object == "response", reply
assert reply.output[0].type == "message" and reply.output[0].id.startswith("msg_"), reply.output
assert reply.output_text == chat.choices[0].message.content, (reply.output_text, chat)
assert reply.usage.input_tokens == chat.usage.prompt_tokens, (reply.usage, chat.usage)
assert reply.usage.output_tokens == chat.usage.completion_tokens, (reply.usage, chat.usage)
expected_status = "incomplete" if chat.choices[0].finish_reason == "length" else "completed"
assert reply.status == expected_status, (reply.status, chat.choices[0].finish_reason)
assert reply.instructions == asked["instructions"], reply.instructions

# Streamed: typed events in order, numbered, whose deltas make the plain answer.
kinds, text, numbers, completed = [], "", [], None
for event in client.responses.create(**asked, stream=True):
    kinds.append(event.type)
    numbers.append(event.sequence_number)
    if event.type == "response.output_text.delta":
        text += event.delta
    if event.type in ("response.completed", "response.incomplete"):
        completed = event.response
assert kinds[:2] == ["response.created", "response.in_progress"], kinds
assert kinds[2:4] == ["response.output_item.added", "response.content_part.added"], kinds
assert kinds[-4:-1] == ["response.output_text.done", "response.content_part.done",
                        "response.output_item.done"], kinds
assert kinds[-1] == ("response.completed" if expected_status == "completed" else "response.incomplete"), kinds
assert numbers == list(range(len(numbers))), numbers
assert completed is not None and text == reply.output_text == completed.output_text, (text, completed)
assert completed.usage.output_tokens == reply.usage.output_tokens, completed.usage

# A conversation that holds a past function call and its output is taken as the chat it is.
follow = client.responses.create(
    model=model, max_output_tokens=8, temperature=0,
    tools=[{"type": "function", "name": "capital", "description": "The capital of a country",
            "parameters": {"type": "object", "properties": {"country": {"type": "string"}},
                           "required": ["country"]}}],
    input=[{"role": "user", "content": [{"type": "input_text", "text": "Capital of France?"}]},
           {"type": "function_call", "call_id": "call_1", "name": "capital",
            "arguments": '{"country": "France"}'},
           {"type": "function_call_output", "call_id": "call_1", "output": "Paris"}])
assert follow.output and follow.status in ("completed", "incomplete"), follow

# A required call: a function_call item (fc_…, its call_id, name and JSON arguments), whole and
# streamed with its argument events; the stream helper's final response holds the same call.
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                          "required": ["city"]}}
called = dict(model=model, input="What is the weather in Paris?", tools=[WEATHER],
              tool_choice="required", max_output_tokens=48, temperature=0)
whole = client.responses.create(**called)
calls = [item for item in whole.output if item.type == "function_call"]
assert calls, whole.output
call = calls[0]
assert call.id.startswith("fc_") and call.call_id and call.name == "get_weather", call
assert isinstance(json.loads(call.arguments).get("city"), str), call.arguments
kinds, arguments = [], ""
for event in client.responses.create(**called, stream=True):
    kinds.append(event.type)
    if event.type == "response.output_item.added" and event.item.type == "function_call":
        assert event.item.name == "get_weather", event.item
    if event.type == "response.function_call_arguments.delta":
        arguments += event.delta
    if event.type == "response.function_call_arguments.done":
        assert event.arguments == arguments, (event.arguments, arguments)
assert "response.function_call_arguments.done" in kinds, kinds
assert json.loads(arguments) == json.loads(call.arguments), (arguments, call.arguments)
with client.responses.stream(**called) as helper:
    final = helper.get_final_response()
assert [i.name for i in final.output if i.type == "function_call"] == ["get_weather"], final.output

# Chat-only fields are refused, naming the Responses API's own.
try:
    client.responses.create(model=model, input="Hi", extra_body={"max_tokens": 4})
except openai.BadRequestError as e:
    assert "max_output_tokens" in str(e), e
else:
    raise AssertionError("max_tokens was accepted")

# What needs a response kept on the server is refused by name.
try:
    client.responses.create(model=model, input="Go on.", previous_response_id=reply.id)
except openai.BadRequestError as e:
    assert "previous_response_id" in str(e), e
else:
    raise AssertionError("previous_response_id was accepted though nothing is kept")
print("responses client: ok")
