"""A real three-member etcd cluster on loopback for tests and scripts/chaos: free ports, temp dirs.

    with EtcdCluster(3) as cluster:
        store = open_store(cluster.url)        # etcd://127.0.0.1:A,127.0.0.1:B,127.0.0.1:C
        cluster.kill(cluster.leader())         # SIGKILL one member
        cluster.restart(i)                     # same data dir and ports: it rejoins

Same short raft timings as tests.support.etcd_server (leases of 1 s are possible), members die
with the parent process. ``leader()`` asks each live member's /v3/maintenance/status.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tests.support.etcd_server import ETCD_BINARY, START_TIMEOUT_S, _die_with_parent
from tests.support.servers import free_port


@dataclass
class Member:
    name: str
    client_port: int
    peer_port: int
    data_dir: Path
    proc: subprocess.Popen | None = None

    @property
    def client(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    @property
    def peer(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def _post_json(url: str, body: dict, timeout: float = 1.0) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


class EtcdCluster:
    def __init__(self, size: int = 3, binary: str = ETCD_BINARY):
        self.binary = binary
        self.size = size
        self.root: Path | None = None
        self.members: list[Member] = []

    @property
    def url(self) -> str:
        return "etcd://" + ",".join(f"127.0.0.1:{m.client_port}" for m in self.members)

    def start(self) -> EtcdCluster:
        self.root = Path(tempfile.mkdtemp(prefix="fabric-etcd-cluster-"))
        self.members = [Member(f"m{i}", free_port(), free_port(), self.root / f"m{i}") for i in range(self.size)]
        for i in range(self.size):
            self._spawn(i, "new")
        if not self.wait_healthy():
            tails = "\n".join(self.log_tail(i) for i in range(self.size))
            self.stop()
            raise RuntimeError(f"etcd cluster did not become healthy:\n{tails}")
        return self

    def _spawn(self, i: int, state: str) -> None:
        m = self.members[i]
        m.data_dir.mkdir(parents=True, exist_ok=True)
        initial = ",".join(f"{o.name}={o.peer}" for o in self.members)
        with open(m.data_dir / "etcd.log", "ab") as log:
            m.proc = subprocess.Popen(
                [self.binary, "--name", m.name, "--data-dir", str(m.data_dir / "data"),
                 "--listen-client-urls", m.client, "--advertise-client-urls", m.client,
                 "--listen-peer-urls", m.peer, "--initial-advertise-peer-urls", m.peer,
                 "--initial-cluster", initial, "--initial-cluster-state", state,
                 "--initial-cluster-token", f"fabric-test-{self.root.name}",
                 "--heartbeat-interval", "50", "--election-timeout", "500", "--log-level", "warn"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=_die_with_parent)  # noqa: PLW1509 (one pre-resolved prctl call)

    def status(self, i: int) -> dict | None:
        """The member's maintenance status (its member_id in header, the leader's id), or None."""
        m = self.members[i]
        if not m.alive():
            return None
        try:
            return _post_json(f"{m.client}/v3/maintenance/status", {})
        except (OSError, ValueError):
            return None

    def leader(self) -> int | None:
        """Index of the member that every live member reporting a leader names, or None."""
        ids: dict[str, int] = {}
        named: set[str] = set()
        for i in range(self.size):
            st = self.status(i)
            if st is None:
                continue
            ids[st["header"]["member_id"]] = i
            if st.get("leader") and st["leader"] != "0":
                named.add(st["leader"])
        if len(named) == 1 and (lid := named.pop()) in ids:
            return ids[lid]
        return None

    def wait_healthy(self, timeout: float = START_TIMEOUT_S) -> bool:
        """Every live member answers /health true (which needs a leader and a quorum)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            live = [m for m in self.members if m.alive()]
            if all(self._healthy(m) for m in live) and self.leader() is not None:
                return True
            time.sleep(0.1)
        return False

    @staticmethod
    def _healthy(m: Member) -> bool:
        try:
            with urllib.request.urlopen(f"{m.client}/health", timeout=1) as resp:
                return b'"health":"true"' in resp.read()
        except OSError:
            return False

    def kill(self, i: int) -> None:
        m = self.members[i]
        if m.alive():
            os.killpg(m.proc.pid, signal.SIGKILL)
            m.proc.wait(10)

    def restart(self, i: int) -> None:
        """Start a killed member again on its data dir and ports: it rejoins the cluster."""
        assert not self.members[i].alive(), f"member {i} is still running"
        self._spawn(i, "existing")

    def log_tail(self, i: int, n: int = 1500) -> str:
        path = self.members[i].data_dir / "etcd.log"
        return f"--- etcd {self.members[i].name}\n" + (path.read_text(errors="replace")[-n:] if path.exists() else "")

    def stop(self) -> None:
        for i in range(len(self.members)):
            self.kill(i)
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    def __enter__(self) -> EtcdCluster:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
