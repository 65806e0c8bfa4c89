"""Run `fabric-engine-sim` as a child process: for the agent's dry-run driver and tests.

    with EngineProcess.start(["--model", "m", "--tokens-per-s", "0"]) as engine:
        httpx.get(engine.url + "/v1/models")

The child is started with the same interpreter (`python -m enginesim`), on a
free loopback port unless one is given, and `start` returns only once it answers
GET /v1/models (not /health, which may be failing on purpose).

free_port() only finds a port that nobody holds at that moment; another process may bind it
before the server does. on_free_port() is the one way to start a server on such a port: the
starter raises PortTaken when its server could not bind, and it is started again on another.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, TypeVar

import httpx

from common.errors import TransientError

T = TypeVar("T")
PORT_ATTEMPTS = 5


class PortTaken(TransientError):
    """A server could not bind the port it was given: another process took it after free_port()."""


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now (for a server: on_free_port; for an address that must
    refuse connections: as it is)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def bind_failed(output: str) -> bool:
    """A server's output says its port was taken: uvicorn's and Python's EADDRINUSE ("address already
    in use"), and common.port_holder's "HOST:PORT is already in use by pid ..." (fabricd, the agent)."""
    return "already in use" in output.lower()


def on_free_port(start: Callable[[int], T], host: str = "127.0.0.1", attempts: int = PORT_ATTEMPTS) -> T:
    """start(port) on a free port; when it raises PortTaken, again on a new one."""
    for _ in range(attempts - 1):
        try:
            return start(free_port(host))
        except PortTaken:
            continue
    return start(free_port(host))


@dataclass
class EngineProcess:
    proc: subprocess.Popen
    host: str
    port: int
    # A file, not a pipe: a chatty child must never block on a full pipe.
    stderr: IO[bytes]

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @classmethod
    def start(
        cls, args: list[str], host: str = "127.0.0.1", port: int | None = None, ready_timeout_s: float = 20.0
    ) -> EngineProcess:
        if not port:
            return on_free_port(lambda p: cls.start(args, host, p, ready_timeout_s), host)
        cmd = [sys.executable, "-m", "enginesim", "--host", host, "--port", str(port), *args]
        stderr = tempfile.TemporaryFile()  # noqa: SIM115 - owned by the EngineProcess, closed in stop()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=stderr)
        engine = cls(proc=proc, host=host, port=port, stderr=stderr)
        try:
            engine._wait_ready(ready_timeout_s)
        except BaseException:
            engine.stop()
            raise
        return engine

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.stderr.seek(0)
                err = self.stderr.read().decode(errors="replace")[-2000:]
                if bind_failed(err):
                    raise PortTaken(f"fabric-engine-sim could not bind {self.url}: {err}")
                raise TransientError(f"fabric-engine-sim exited with {self.proc.returncode}: {err}")
            try:
                if httpx.get(self.url + "/v1/models", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise TransientError(f"fabric-engine-sim on {self.url} not ready after {timeout_s}s")

    def stop(self, timeout_s: float = 5.0) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.stderr.close()

    def __enter__(self) -> EngineProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
