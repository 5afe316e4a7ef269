"""What the speculation scripts share: an `engine serve` on a free loopback port, and one greedy
chat answer from it without prompt cache (each answer prefills its whole prompt, as a new
conversation does, and no setting starts from another's cache)."""
import json
import socket
import subprocess
import sys
import time
import urllib.request


def start_engine(engine, model, threads):
    """`engine serve` on a free port, healthy; returns (process, port). Its log goes to this
    script's stderr: a model that does not load says why there."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    argv = [engine, "serve", "-m", model, "--port", str(port), "-t", threads, "-c", "4096"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
    for _ in range(1200):
        if proc.poll() is not None:
            sys.exit(f"engine serve exited with status {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc, port
        except OSError:
            pass
        time.sleep(0.1)
    proc.kill()
    sys.exit("engine serve did not become healthy")


def answer(port, prompt, tokens, extra):
    """The `timings` of a greedy answer of `tokens` tokens to `prompt`, with `extra` fields."""
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": tokens, "temperature": 0,
            "cache_prompt": False, **extra}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=900) as r:
        return json.load(r)["timings"]
