"""Many tiny HTTP/1.1 servers in one process, one per loopback port, for fleet-sized benchmarks.

The simulated engines (lab.rigs.sim_engines) and agents (lab.rigs.sim_agents) each serve hundreds
or thousands of ports from one helper process: a uvicorn per port would cost more than the code
under test. This reads a request line, headers and a Content-Length body, and hands
(port, method, path, body) to an async handler that returns (status, body), or None to never answer
(a silent peer: the connection stays open and unanswered). Keep-alive as HTTP/1.1 does, until
POST /sim/drop-idle (each helper routes it to ``drop_idle``) closes the idle ones. Every accepted
connection is counted per port, so a benchmark can tell how many connections a client opened.
"""

from __future__ import annotations

import asyncio
import functools
import json
import resource
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
Handler = Callable[[int, str, str, bytes], Awaitable[tuple[int, bytes] | None]]


def raise_fd_limit(want: int = 65536) -> None:
    """Thousands of listening ports and their connections: lift the soft limit up to the hard one
    (root may raise the hard one too)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    for target in ((want, max(hard, want)), (min(want, hard), hard)):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, target)
            return
        except (ValueError, OSError):
            continue


class LoopbackServers:
    def __init__(self, count: int, handler: Handler):
        self.count = count
        self.ports: list[int] = []  # bound by start(), in order
        self.handler = handler
        self.connections: dict[int, int] = {}  # accepted, per port
        self.idle: set[asyncio.StreamWriter] = set()  # kept-alive connections between requests

    def drop_idle(self) -> int:
        """Close every kept-alive connection waiting for its next request, as a server's keep-alive
        timeout does between two of a controller's passes (uvicorn's is 5 s; fabricd's routing
        pass comes every 10 s, reconcile every 15 s)."""
        dropped = list(self.idle)
        for w in dropped:
            w.close()
        self.idle.clear()
        return len(dropped)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, port: int) -> None:
        self.connections[port] = self.connections.get(port, 0) + 1
        try:
            while True:
                self.idle.add(writer)
                line = await reader.readline()
                self.idle.discard(writer)
                if not line:
                    break
                method, path, _ = line.decode().split(" ", 2)
                length = 0
                while True:
                    h = await reader.readline()
                    if h in (b"\r\n", b"\n", b""):
                        break
                    if h.lower().startswith(b"content-length:"):
                        length = int(h.split(b":")[1])
                body = await reader.readexactly(length) if length else b""
                answer = await self.handler(port, method, path, body)
                if answer is None:  # silent: hold the connection, never answer
                    await asyncio.Event().wait()
                    return
                status, out = answer
                reason = {200: b"OK", 404: b"Not Found"}.get(status, b"Status")
                writer.write(b"HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n"
                             % (status, reason, len(out)) + out)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            self.idle.discard(writer)
            writer.close()

    async def start(self) -> None:
        """Bind ``count`` free loopback ports here, so no other process can take one meanwhile."""
        for _ in range(self.count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
            self.ports.append(port)
            await asyncio.start_server(functools.partial(self._serve, port=port), sock=sock, backlog=1024)

    async def serve_forever(self) -> None:
        """A helper process's life: listen, say "ready PORT,PORT,..." (HelperProcess reads it)."""
        raise_fd_limit()
        await self.start()
        print("ready " + ",".join(map(str, self.ports)), flush=True)
        await asyncio.Event().wait()


class HelperProcess:
    """A helper (``python -m <module> COUNT ARGS...``) serving COUNT ports it binds itself, which
    it prints after "ready" (``ports``, once entered); a context manager. Its /sim/* controls go to
    ``ports[0]``; ``stats()`` reads GET /sim/stats with ``connections`` less the ones these controls
    opened, so it counts only the client's."""

    module = ""

    def __init__(self, count: int, *args: str):
        self.count = count
        self.ports: list[int] = []
        self.args = args
        self.proc: subprocess.Popen | None = None
        self.control_connections = 0

    def __enter__(self):
        self.proc = subprocess.Popen([sys.executable, "-m", self.module, str(self.count), *self.args],
                                     stdout=subprocess.PIPE, text=True, cwd=ROOT)
        assert self.proc.stdout is not None
        ready, _, ports = self.proc.stdout.readline().strip().partition(" ")
        if ready != "ready":
            self.close()
            raise RuntimeError(f"{self.module} did not start")
        self.ports = [int(p) for p in ports.split(",")]
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait()
            self.proc = None

    def post(self, port: int, path: str, body: bytes) -> None:
        self.control_connections += 1
        req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, method="POST")
        with urllib.request.urlopen(req, timeout=30) as resp:
            resp.read()

    def drop_idle(self) -> None:
        """Every server closes its idle kept-alive connections (LoopbackServers.drop_idle)."""
        self.post(self.ports[0], "/sim/drop-idle", b"")

    def stats(self) -> dict:
        self.control_connections += 1
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ports[0]}/sim/stats", timeout=30) as resp:
            out = json.loads(resp.read())
        out["connections"] -= self.control_connections
        return out
