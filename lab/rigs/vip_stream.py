"""Streaming chat completions straight to a VIP, run inside the lab's client namespace.

    ip netns exec fabric-lab-client python -m lab.rigs.vip_stream --url http://VIP:8000 \
        --model M --workers 2 [--max-tokens 8] [--timeout 5]

Each worker opens a new TCP connection per call (so every call is a new flow through the XDP
Maglev program) and streams one completion. On stdout, one JSON line when a call starts,
{"w": worker, "start": t0}, and one when it ends, {"w", "start", "end", "ok": bool, "error": str};
times from CLOCK_MONOTONIC, which is the same clock in every process of the machine, so the
parent can line calls up with its own injections. Runs until stdin closes (the parent's end) or
SIGTERM; with --once, one call and exit (status 0 only if it succeeded).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time

import httpx


def stream_once(http: httpx.Client, url: str, body: dict) -> tuple[bool, str]:
    try:
        with http.stream("POST", url, json=body) as r:
            if r.status_code != 200:
                return False, f"http {r.status_code}"
            text = "".join(r.iter_text())
    except httpx.TimeoutException:
        return False, "timeout"
    except httpx.TransportError as exc:
        return False, type(exc).__name__
    return ("data: [DONE]" in text), ("" if "data: [DONE]" in text else "stream cut")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True, help="http://VIP:PORT")
    ap.add_argument("--model", required=True)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=5.0)
    ap.add_argument("--once", action="store_true", help="one call, then exit")
    args = ap.parse_args()
    stop = threading.Event()
    out = threading.Lock()
    url = args.url.rstrip("/") + "/v1/chat/completions"
    body = {"model": args.model, "stream": True, "max_tokens": args.max_tokens,
            "messages": [{"role": "user", "content": "hi"}]}

    def say(record: dict) -> None:
        with out:
            print(json.dumps(record), flush=True)

    def call(worker: int) -> bool:
        # a fresh client each call: a new connection, so a new flow through the dataplane
        with httpx.Client(timeout=args.timeout, headers={"connection": "close"}) as http:
            t0 = time.monotonic()
            say({"w": worker, "start": t0})
            ok, error = stream_once(http, url, body)
        say({"w": worker, "start": t0, "end": time.monotonic(), "ok": ok, "error": error})
        return ok

    def work(worker: int) -> None:
        while not stop.is_set():
            if not call(worker):
                time.sleep(0.1)

    if args.once:
        return 0 if call(0) else 1

    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(args.workers)]
    for t in threads:
        t.start()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    while not stop.is_set():
        stop.wait(0.2)
    for t in threads:
        t.join(args.timeout + 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
