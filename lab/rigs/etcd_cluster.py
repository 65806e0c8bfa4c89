"""A real three-member etcd cluster on loopback for tests and scripts/chaos: free ports, temp dirs.

    with EtcdCluster(3) as cluster:
        store = cluster.open("fabricd")        # etcd://127.0.0.1:A,B,C over TLS, logged in as fabricd
        cluster.kill(cluster.leader())         # SIGKILL one member
        cluster.restart(i)                     # same data dir and ports: it rejoins

Same short raft timings as lab.rigs.etcd_server (leases of 1 s are possible), members die
with the parent process. ``leader()`` asks each live member's /v3/maintenance/status.

Secured like the single server by default (docs/store.md, "Secured"): members talk to each other
over TLS and demand a peer certificate from the etcd CA (--peer-client-cert-auth), serve clients
over TLS demanding a client certificate, and have auth on with Fabric's users and roles.
``cluster.open(user)`` and ``cluster.env(user)`` as on EtcdServer; ``EtcdCluster(3, secure=False)``
is plain HTTP.
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

from common.pki import client_ssl_context
from lab.rigs.etcd_server import (
    ETCD_BINARY,
    START_TIMEOUT_S,
    ClientsOf,
    _die_with_parent,
    make_certs,
    set_up_auth,
)
from lab.rigs.servers import free_port


@dataclass
class Member:
    name: str
    client_port: int
    peer_port: int
    data_dir: Path
    proc: subprocess.Popen | None = None
    scheme: str = "https"

    @property
    def client(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.client_port}"

    @property
    def peer(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.peer_port}"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def _post_json(url: str, body: dict, timeout: float = 1.0, ctx=None, token: str = "") -> dict:
    headers = {"content-type": "application/json"} | ({"authorization": token} if token else {})
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers=headers)
    with urllib.request.urlopen(req, timeout=timeout, context=ctx) as resp:
        return json.loads(resp.read())


class EtcdCluster(ClientsOf):
    def __init__(self, size: int = 3, binary: str = ETCD_BINARY, *, secure: bool = True):
        self.binary = binary
        self.size = size
        self.secure = secure
        self.root: Path | None = None
        self.members: list[Member] = []
        self._ctx = None
        self._auth = False  # set once init_auth turned auth on: status() then logs in as root

    @property
    def certs(self) -> Path:
        assert self.root is not None
        return self.root / "certs"

    def _tls_flags(self, m: Member) -> list[str]:
        if not self.secure:
            return []
        c = self.certs
        crt, key, ca = str(c / f"{m.name}.crt"), str(c / f"{m.name}.key"), str(c / "ca.crt")
        return ["--cert-file", crt, "--key-file", key, "--client-cert-auth", "--trusted-ca-file", ca,
                "--peer-cert-file", crt, "--peer-key-file", key, "--peer-client-cert-auth",
                "--peer-trusted-ca-file", ca, "--bcrypt-cost", "4"]

    @property
    def url(self) -> str:
        return "etcd://" + ",".join(f"127.0.0.1:{m.client_port}" for m in self.members)

    def start(self) -> EtcdCluster:
        self.root = Path(tempfile.mkdtemp(prefix="fabric-etcd-cluster-"))
        scheme = "https" if self.secure else "http"
        self.members = [Member(f"m{i}", free_port(), free_port(), self.root / f"m{i}", scheme=scheme)
                        for i in range(self.size)]
        if self.secure:
            c = make_certs(self.root, [m.name for m in self.members])
            self._ctx = client_ssl_context(c / "ca.crt", c / "etcd-root.crt", c / "etcd-root.key")
        for i in range(self.size):
            self._spawn(i, "new")
        if not self.wait_healthy():
            tails = "\n".join(self.log_tail(i) for i in range(self.size))
            self.stop()
            raise RuntimeError(f"etcd cluster did not become healthy:\n{tails}")
        if self.secure:
            set_up_auth(self.certs, [("127.0.0.1", m.client_port) for m in self.members])
            self._auth = True
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
                 "--heartbeat-interval", "50", "--election-timeout", "500", "--log-level", "warn",
                 *self._tls_flags(m)],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=_die_with_parent)  # noqa: PLW1509 (one pre-resolved prctl call)

    def status(self, i: int) -> dict | None:
        """The member's maintenance status (its member_id in header, the leader's id), or None."""
        m = self.members[i]
        if not m.alive():
            return None
        try:
            return _post_json(f"{m.client}/v3/maintenance/status", {}, ctx=self._ctx, token=self._root_token(m))
        except (OSError, ValueError):
            return None

    def _root_token(self, m: Member) -> str:
        """With auth on, maintenance status needs a login: a fresh root token from this member
        (a restarted member has forgotten the tokens it knew)."""
        if not self._auth:
            return ""
        password = (self.certs / "passwords" / "root.password").read_text().strip()
        return str(_post_json(f"{m.client}/v3/auth/authenticate", {"name": "root", "password": password},
                              ctx=self._ctx)["token"])

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
            if all(self._healthy(m, self._ctx) for m in live) and self.leader() is not None:
                return True
            time.sleep(0.1)
        return False

    @staticmethod
    def _healthy(m: Member, ctx) -> bool:
        try:
            with urllib.request.urlopen(f"{m.client}/health", timeout=1, context=ctx) as resp:
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
