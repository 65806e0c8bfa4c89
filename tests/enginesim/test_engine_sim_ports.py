"""enginesim.process's ports: a server whose port another process took between free_port()
and its bind is told apart (PortTaken) and on_free_port starts it again on another port; a real
fabric-engine-sim and a real listener in the way."""

from __future__ import annotations

import socket

import httpx
import pytest

from enginesim.process import EngineProcess, PortTaken, bind_failed, on_free_port

ARGS = ["--model", "sim-m", "--tokens-per-s", "0"]


def _listener(port: int) -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", port))
    sock.listen()
    return sock


def test_an_engine_whose_port_is_taken_raises_port_taken():
    with _listener(0) as held:
        with pytest.raises(PortTaken, match="could not bind"):
            EngineProcess.start(ARGS, port=held.getsockname()[1])


def test_on_free_port_starts_again_on_another_port_when_the_first_was_taken_meanwhile():
    tried: list[int] = []
    held: list[socket.socket] = []

    def start(port: int) -> EngineProcess:
        tried.append(port)
        if len(tried) == 1:  # another process binds the port between free_port() and the engine's bind
            held.append(_listener(port))
        return EngineProcess.start(ARGS, port=port)

    try:
        with on_free_port(start) as engine:
            assert len(tried) == 2 and engine.port == tried[1] != tried[0]
            assert httpx.get(engine.url + "/v1/models", timeout=5).status_code == 200
    finally:
        for sock in held:
            sock.close()


def test_bind_failures_are_recognised_in_each_servers_words():
    assert bind_failed("ERROR: [Errno 98] error while attempting to bind on address ('127.0.0.1', 1): "
                       "address already in use")
    assert bind_failed("fabricd: 127.0.0.1:8080 is already in use by pid 7 (python3 -m http.server)")
    assert not bind_failed("fabricd: the store is not reachable")
