#!/usr/bin/env python3
"""The `openai` package against `engine serve`: a plain chat, a streamed chat, a completion and
a bad request. Usage: openai_client.py BASE_URL (e.g. http://127.0.0.1:8080/v1)."""
import sys

import openai

client = openai.OpenAI(base_url=sys.argv[1], api_key="unused-on-loopback")
model = client.models.list().data[0].id

reply = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "What is 2+2?"}], max_tokens=16, temperature=0)
text = reply.choices[0].message.content
assert text, reply
assert reply.choices[0].finish_reason in ("stop", "length"), reply
assert reply.usage.completion_tokens > 0, reply

streamed = ""
finish = None
for chunk in client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "What is 2+2?"}], max_tokens=16, temperature=0,
        stream=True):
    if chunk.choices:
        streamed += chunk.choices[0].delta.content or ""
        finish = chunk.choices[0].finish_reason or finish
assert streamed == text, (streamed, text)
assert finish in ("stop", "length"), finish

completion = client.completions.create(model=model, prompt="The capital of France is", max_tokens=4, temperature=0)
assert completion.choices[0].text.startswith(" Paris"), completion

try:
    client.chat.completions.create(model=model, messages=[], max_tokens=4)
except openai.BadRequestError as e:
    assert e.status_code == 400
else:
    raise AssertionError("an empty chat was accepted")
print("openai client: ok")
