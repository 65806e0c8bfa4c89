"""Network namespaces for dataplane traffic tests: a client, a node with XDP on
its ingress veth, backends behind the node's bridge and one routed backend.

    client c-S (10.0.0.2) --veth-- (10.0.0.1 ni) node n-S (ip_forward)
                                         br0 10.1.0.1 -- b1..bN (10.1.0.1k, HTTP :8080)
                                         nr  10.2.0.1 -- r (10.2.0.2, HTTP :8080, no route back)

Everything is made with a random suffix and torn down by close(); nothing
touches the host's own interfaces.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from agent.dataplane.netns import run_in_netns
from agent.dataplane.veth import prepare_veth_end
from lab.rigs.bpf import new_pin_dir
from lab.rigs.polling import wait_for

VIP = "10.9.0.100"
NODE_IP = "10.2.0.1"
ROUTED_BACKEND = "10.2.0.2:8080"
HERE = Path(__file__).resolve().parent

SERVER = r"""
import sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
NAME = sys.argv[1].encode()
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        # /pause/S: the name, then S seconds of silence, then the name again (a
        # streamed response waiting for its next token while the client says nothing)
        pause = float(self.path.split("/")[2]) if self.path.startswith("/pause/") else None
        body = NAME if pause is None else NAME + b"|" + NAME
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if pause is None:
            self.wfile.write(body)
            return
        self.wfile.write(NAME + b"|")
        self.wfile.flush()
        time.sleep(pause)
        self.wfile.write(NAME)
    def do_POST(self):
        # an upload: answers with the number of bytes it received
        left, got = int(self.headers["Content-Length"]), 0
        while left:
            chunk = self.rfile.read(min(left, 65536))
            if not chunk:
                break
            got += len(chunk)
            left -= len(chunk)
        body = str(got).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
ThreadingHTTPServer.daemon_threads = True
ThreadingHTTPServer(("0.0.0.0", 8080), H).serve_forever()
"""


def sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, timeout=30)


@dataclass
class NsLab:
    suffix: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    backends: int = 3
    servers: list = field(default_factory=list)
    namespaces: list = field(default_factory=list)

    def ns(self, role: str) -> str:
        return f"fab{role}-{self.suffix}"

    @property
    def node(self) -> str:
        return self.ns("n")

    @property
    def client(self) -> str:
        return self.ns("c")

    def backend_address(self, i: int) -> str:
        return f"10.1.0.{10 + i}:8080"

    def build(self) -> None:
        roles = ["c", "n", "r"] + [f"b{i}" for i in range(1, self.backends + 1)]
        for role in roles:
            sh("ip", "netns", "add", self.ns(role))
            self.namespaces.append(self.ns(role))
            sh("ip", "-n", self.ns(role), "link", "set", "lo", "up")
        node, client = self.node, self.client
        sh("ip", "link", "add", "ni", "netns", node, "type", "veth", "peer", "name", "eth0", "netns", client)
        sh("ip", "-n", node, "addr", "add", "10.0.0.1/24", "dev", "ni")
        sh("ip", "-n", client, "addr", "add", "10.0.0.2/24", "dev", "eth0")
        sh("ip", "-n", node, "link", "set", "ni", "up")
        sh("ip", "-n", client, "link", "set", "eth0", "up")
        sh("ip", "-n", client, "route", "add", "default", "via", "10.0.0.1")
        sh("ip", "-n", node, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", node, "addr", "add", "10.1.0.1/24", "dev", "br0")
        sh("ip", "-n", node, "link", "set", "br0", "up")
        for i in range(1, self.backends + 1):
            b = self.ns(f"b{i}")
            sh("ip", "link", "add", f"vb{i}", "netns", node, "type", "veth", "peer", "name", "eth0", "netns", b)
            sh("ip", "-n", node, "link", "set", f"vb{i}", "master", "br0", "up")
            sh("ip", "-n", b, "addr", "add", f"10.1.0.{10 + i}/24", "dev", "eth0")
            sh("ip", "-n", b, "link", "set", "eth0", "up")
            sh("ip", "-n", b, "route", "add", "default", "via", "10.1.0.1")
        r = self.ns("r")
        sh("ip", "link", "add", "nr", "netns", node, "type", "veth", "peer", "name", "eth0", "netns", r)
        sh("ip", "-n", node, "addr", "add", f"{NODE_IP}/24", "dev", "nr")
        sh("ip", "-n", node, "link", "set", "nr", "up")
        sh("ip", "-n", r, "addr", "add", "10.2.0.2/24", "dev", "eth0")
        sh("ip", "-n", r, "link", "set", "eth0", "up")
        sh("ip", "netns", "exec", node, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        # XDP redirects into a veth only when its peer runs NAPI (GRO), and senders whose packets
        # meet XDP must send complete checksums (agent/dataplane/veth.py), as the lab does
        for role in ["c", "r"] + [f"b{i}" for i in range(1, self.backends + 1)]:
            prepare_veth_end(self.ns(role), "eth0")
        for i in range(1, self.backends + 1):
            self._serve(self.ns(f"b{i}"), f"b{i}")
        self._serve(r, "r")
        for addr in [self.backend_address(i) for i in range(1, self.backends + 1)] + [ROUTED_BACKEND]:
            self._wait_listening(addr)

    def add_small_mtu_backend(self, mtu: int = 1200) -> str:
        """Backend m (10.5.0.2:8080) on its own bridge br1 whose links have a smaller MTU,
        advertising the larger MSS a tunnel or middle link would hide: the client's full-size
        segments need the node's "fragmentation needed" to reach it, translated for the VIP."""
        node, m = self.node, self.ns("m")
        sh("ip", "netns", "add", m)
        self.namespaces.append(m)
        sh("ip", "-n", m, "link", "set", "lo", "up")
        sh("ip", "-n", node, "link", "add", "br1", "type", "bridge")
        sh("ip", "-n", node, "addr", "add", "10.5.0.1/24", "dev", "br1")
        sh("ip", "link", "add", "vm1", "netns", node, "mtu", str(mtu), "type", "veth", "peer", "name", "eth0",
           "netns", m, "mtu", str(mtu))
        sh("ip", "-n", node, "link", "set", "vm1", "master", "br1", "up")
        sh("ip", "-n", node, "link", "set", "br1", "up")
        sh("ip", "-n", m, "addr", "add", "10.5.0.2/24", "dev", "eth0")
        sh("ip", "-n", m, "link", "set", "eth0", "up")
        prepare_veth_end(m, "eth0")
        sh("ip", "-n", m, "route", "add", "default", "via", "10.5.0.1", "advmss", "1460")
        self._serve(m, "m")
        self._wait_listening("10.5.0.2:8080")
        return "10.5.0.2:8080"

    def _serve(self, ns: str, name: str) -> None:
        proc = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", SERVER, name],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.servers.append(proc)

    def _wait_listening(self, addr: str) -> None:
        ip, port = addr.split(":")
        # from the node namespace, which reaches every backend directly

        def listening() -> bool:
            try:
                run_in_netns(self.node, lambda: socket.create_connection((ip, int(port)), timeout=1).close())
                return True
            except OSError:
                return False

        wait_for(listening, 10, f"backend {addr} to listen", interval=0.1)

    def connect(self, port: int = 80) -> socket.socket:
        """A TCP connection from the client namespace to the VIP."""
        return run_in_netns(self.client, lambda: socket.create_connection((VIP, port), timeout=5))

    def names(self, count: int, port: int = 80, first_source_port: int | None = None) -> list[str]:
        """`count` fresh connections to the VIP, one GET each: the backend names. With
        first_source_port, the connections use source ports first_source_port.. in order (a fixed
        sample of flows, so a share test gives the same answer on every run)."""

        def body() -> list[str]:
            out = []
            for i in range(count):
                source = None if first_source_port is None else ("", first_source_port + i)
                with socket.create_connection((VIP, port), timeout=5, source_address=source) as s:
                    out.append(http_get(s))
            return out

        return run_in_netns(self.client, body)

    def close(self) -> None:
        for proc in self.servers:
            proc.kill()
            proc.wait(timeout=10)
        for ns in self.namespaces:
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True, timeout=30)


def http_get(sock: socket.socket) -> str:
    """One keep-alive GET on an open connection; the body (the backend's name)."""
    sock.sendall(b"GET / HTTP/1.1\r\nHost: vip\r\n\r\n")
    return read_response(sock)


def read_response(sock: socket.socket) -> str:
    """The body of the next HTTP response on the connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError("closed before the response headers")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    while len(body) < length:
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError("closed mid-body")
        body += chunk
    return body.decode()


class AgentProcess:
    """dataplane_agent_proc.py: a separate process owning the Dataplane."""

    def __init__(self, pin_dir: str, node_ns: str, ifaces: list[str]):
        self.args = [sys.executable, str(HERE / "dataplane_agent_proc.py"), pin_dir, NODE_IP, node_ns, *ifaces]
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        env = dict(os.environ, PYTHONPATH=str(HERE.parents[1]))
        self.proc = subprocess.Popen(self.args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        assert self.call("ping") == "pong"

    def call(self, op: str, *args):
        import json

        assert self.proc is not None and self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(json.dumps({"op": op, "args": args}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"agent process exited with {self.proc.wait()}")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(reply["error"])
        return reply["ok"]

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


@contextmanager
def agent_lab() -> Iterator[NsLab]:
    """An NsLab with a real fabric-agent serving its node namespace (pins in a fresh directory),
    all removed on exit."""
    lab = NsLab()
    pin_dir = new_pin_dir()
    agent = AgentProcess(pin_dir, lab.node, ["ni", "nr"])
    try:
        lab.build()
        agent.start()
        lab.agent = agent
        yield lab
    finally:
        agent.kill()
        lab.close()
        shutil.rmtree(pin_dir, ignore_errors=True)
