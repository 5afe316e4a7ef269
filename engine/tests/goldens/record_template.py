#!/usr/bin/env python3
"""Records how llama.cpp (`--jinja`) renders a chat template, for the engine's template test:
llama-server runs a tiny model with the template given by --chat-template-file, and
/apply-template renders each conversation below, with thinking off and on (llama-server turns it
on when a request leaves it out; the engine leaves it to the template, off for Gemma 4).

Usage: record_template.py LLAMA_BIN_DIR MODEL.gguf TEMPLATE.jinja OUT.json
"""
import json
import sys

from record import post, start_server

CONVERSATIONS = [
    [{"role": "user", "content": "What is the dose?"}],
    [{"role": "system", "content": "Answer from the letter only."},
     {"role": "user", "content": "Summarise:\n\nDear Dr. Berg, the patient is well."}],
    [{"role": "system", "content": "Be brief."},
     {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello. How can I help?"},
     {"role": "user", "content": "  List two colours.  "}],
]


def main():
    bin_dir, model, template, out = sys.argv[1:5]
    server, port = start_server(bin_dir, model, ["--jinja", "--chat-template-file", template])
    try:
        cases = []
        for messages in CONVERSATIONS:
            for thinking in (False, True):
                body = {"messages": messages, "chat_template_kwargs": {"enable_thinking": thinking}}
                prompt = post(port, "/apply-template", body)["prompt"]
                cases.append({"messages": messages, "enable_thinking": thinking, "prompt": prompt})
    finally:
        server.kill()
        server.wait()
    with open(out, "w") as f:
        json.dump({"template": template.rsplit("/", 1)[-1], "cases": cases}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
