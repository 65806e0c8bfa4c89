"""Small helpers for tests that run real servers on loopback."""

from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager

import uvicorn

# The suite's one free_port (and on_free_port, which starts a server again when its port was taken
# meanwhile) are enginesim.process's; re-exported here for the tests that import it from here.
from enginesim.process import free_port

__all__ = ["free_port", "serve_in_thread"]


@contextmanager
def serve_in_thread(app, **config):
    """uvicorn in a thread on a loopback socket bound here and handed over (no window in which
    another process could take the port); yields the port, stops on exit."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", **config))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
