"""The simulator's two SIGTERM behaviours, vLLM 0.32's (enginesim/engine.py Engine.stop):
--shutdown-timeout 0 (vLLM's default) stops at once; N lets the running requests finish while
/health stays 200 and new requests get 500. The second is held to the real engine in
test_conformance_real.py; the first was, until the conformance module took Fabric's guests'
--shutdown-timeout 30."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

import httpx

from lab.rigs.polling import wait_for
from lab.rigs.servers import free_port


def _serve(*flags: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "enginesim", "--host", "127.0.0.1", "--port", str(port),
                             "--model", "m", "--max-num-seqs", "1", "--tokens-per-s", "50", *flags],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: _health(url) == "200", 30, "the simulator serving")
    return proc, url


def _health(url: str) -> str:
    try:
        return str(httpx.get(f"{url}/health", timeout=2).status_code)
    except httpx.HTTPError as exc:
        return type(exc).__name__


def _streams(url: str, n: int, tokens: int) -> tuple[list[dict], list[threading.Thread]]:
    seen: list[dict] = []

    def one() -> None:
        got = {"tokens": 0, "done": False}
        seen.append(got)
        body = {"model": "m", "prompt": "hi", "max_tokens": tokens, "stream": True}
        try:
            with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=httpx.Timeout(30, read=3)) as r:
                for line in r.iter_lines():
                    if line == "data: [DONE]":
                        got["done"] = True
                    elif line.startswith("data: "):
                        got["tokens"] += 1
        except httpx.HTTPError as exc:
            got["error"] = type(exc).__name__

    threads = [threading.Thread(target=one, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    wait_for(lambda: any(g["tokens"] for g in seen), 10, "a stream with tokens")
    return seen, threads


def test_default_sigterm_stops_at_once_and_the_running_stream_gets_no_end():
    proc, url = _serve()
    try:
        seen, threads = _streams(url, 1, 100)  # 2 s at 50 tokens/s
        proc.send_signal(signal.SIGTERM)
        wait_for(lambda: _health(url) == "ConnectError", 5, "the listener closed")
        for t in threads:
            t.join(10)
        (got,) = seen
        assert not got["done"] and got["tokens"] < 100, got
        proc.wait(10)
    finally:
        proc.kill()
        proc.wait()


def test_shutdown_timeout_lets_the_running_stream_finish_and_refuses_new_ones():
    proc, url = _serve("--shutdown-timeout", "20")
    try:
        seen, threads = _streams(url, 2, 100)  # one runs (--max-num-seqs 1), one waits
        time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        assert _health(url) == "200"
        late = httpx.post(f"{url}/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 2}, timeout=5)
        assert late.status_code == 500 and "cannot schedule new futures after shutdown" in late.text
        for t in threads:
            t.join(15)
        ran, waited = sorted(seen, key=lambda g: -g["tokens"])
        assert ran["done"] and ran["tokens"] == 100, seen  # every token, then [DONE]
        assert waited["tokens"] == 0 and not waited["done"], seen  # never scheduled
        proc.wait(10)  # it exits once nothing runs, without waiting for the waiting one's client
    finally:
        proc.kill()
        proc.wait()
