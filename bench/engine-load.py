#!/usr/bin/env python3
"""Load on a running `engine serve`: N concurrent clients for T seconds. Reports, never asserts.

Each client loops on a short greedy chat completion over its own keep-alive connection until the
time is up. Prints the answers per second, the completion tokens per second, the share of 503
answers (a full queue: the engine generates one answer at a time), connection errors, and the
p50/p99 latency of the answered (200) requests and of all of them. With --half-open K, K
slowloris connections (headers begun, never ended) are held open for the whole run and
re-opened whenever the server closes one, as an attacker would.

Usage: bench/engine-load.py --port 8080 [--clients 8] [--seconds 30] [--max-tokens 8]
       [--half-open 0] [--api-key KEY] [--json]
"""
import argparse
import http.client
import json
import socket
import threading
import time


def client(port, key, max_tokens, deadline, results):
    body = json.dumps({
        "messages": [{"role": "user", "content": "Name one colour."}],
        "max_tokens": max_tokens,
        "temperature": 0,
    })
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    conn = None
    while time.monotonic() < deadline:
        start = time.monotonic()
        try:
            if conn is None:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
            conn.request("POST", "/v1/chat/completions", body, headers)
            response = conn.getresponse()
            data = response.read()
            status = response.status
            tokens = 0
            if status == 200:
                tokens = json.loads(data).get("usage", {}).get("completion_tokens", 0)
            results.append((status, time.monotonic() - start, tokens))
            if response.will_close:
                conn.close()
                conn = None
            if status == 503:
                # The server's Retry-After is 1 s; a client hammering faster measures nothing.
                time.sleep(0.1)
        except (OSError, http.client.HTTPException):
            results.append(("error", time.monotonic() - start, 0))
            if conn is not None:
                conn.close()
            conn = None
            time.sleep(0.1)
    if conn is not None:
        conn.close()


def attacker(port, count, stop, reopened):
    held = []
    while not stop.is_set():
        alive = []
        for s in held:
            try:
                s.setblocking(False)
                gone = s.recv(1) == b""
            except BlockingIOError:
                gone = False
            except OSError:
                gone = True
            if gone:
                s.close()
            else:
                alive.append(s)
        held = alive
        while len(held) < count and not stop.is_set():
            try:
                s = socket.create_connection(("127.0.0.1", port), timeout=5)
                s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                held.append(s)
                reopened[0] += 1
            except OSError:
                break
        stop.wait(0.2)
    for s in held:
        s.close()


def percentile(values, p):
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--half-open", type=int, default=0)
    ap.add_argument("--api-key")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    stop, reopened = threading.Event(), [0]
    attack = threading.Thread(target=attacker, args=(args.port, args.half_open, stop, reopened))
    if args.half_open:
        attack.start()
        time.sleep(1)
    results = []
    deadline = time.monotonic() + args.seconds
    started = time.monotonic()
    threads = [threading.Thread(target=client, args=(args.port, args.api_key, args.max_tokens, deadline, results))
               for _ in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started
    stop.set()
    if args.half_open:
        attack.join()

    ok = [r for r in results if r[0] == 200]
    busy = [r for r in results if r[0] == 503]
    errors = [r for r in results if r[0] == "error"]
    other = len(results) - len(ok) - len(busy) - len(errors)
    report = {
        "clients": args.clients,
        "seconds": round(elapsed, 1),
        "max_tokens": args.max_tokens,
        "half_open_held": args.half_open,
        "half_open_opened": reopened[0],
        "requests": len(results),
        "answered_200": len(ok),
        "answers_per_s": round(len(ok) / elapsed, 2),
        "completion_tokens_per_s": round(sum(r[2] for r in ok) / elapsed, 1),
        "share_503": round(len(busy) / len(results), 3) if results else None,
        "connection_errors": len(errors),
        "other_status": other,
        "p50_ms_200": round(percentile([r[1] for r in ok], 50) * 1000),
        "p99_ms_200": round(percentile([r[1] for r in ok], 99) * 1000),
        "p99_ms_all": round(percentile([r[1] for r in results], 99) * 1000),
    }
    if args.json:
        print(json.dumps(report))
    else:
        for k, v in report.items():
            print(f"{k:>24}: {v}")


if __name__ == "__main__":
    main()
