"""A real etcd server for tests: free loopback ports, a temp data dir, cleaned up on exit.

Use the context manager directly, or the session-scoped pytest fixture:

    from lab.rigs.etcd_server import etcd_server   # noqa: F401  (re-export in a conftest)

    def test_x(etcd_server):
        store = etcd_server.open()                      # logged in as fabricd
        env = etcd_server.env("gateway")                # FABRIC_ETCD_* for a gateway process

By default the server is secured as docs/store.md prescribes: client TLS with certificates from
an etcd CA (--client-cert-auth, --trusted-ca-file), and etcd's auth on with the users and roles
`fabricd store init-auth` makes (common.store.etcd_auth), set up by that same code.
``EtcdServer(secure=False)`` is a plain-HTTP loopback etcd without auth.

The fixture skips (with the reason) when /usr/bin/etcd is absent. The server runs with short
raft timings so etcd's minimum lease TTL is 1 s instead of 2 s and lease tests stay quick.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from common.pki import client_ssl_context
from common.store.base import Store
from common.store.connect import open_store
from common.store.etcd_access import EtcdAccess
from common.store.etcd_auth import init_auth
from common.store.etcd_pki import issue_client, issue_server
from lab.rigs.servers import free_port

ETCD_BINARY = os.environ.get("FABRIC_TEST_ETCD", "/usr/bin/etcd")
START_TIMEOUT_S = 30.0
PR_SET_PDEATHSIG = 1


def _libc_prctl():
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


# Resolved in the parent: the child, between fork and exec, must not dlopen (loader locks).
_PRCTL = _libc_prctl()


def _die_with_parent() -> None:
    """In the child before exec: ask Linux to SIGKILL it when the parent exits."""
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, int(signal.SIGKILL))


def etcd_available() -> bool:
    return os.access(ETCD_BINARY, os.X_OK)


def client_access(certs: Path, user: str) -> EtcdAccess:
    """The access of `user` to a test etcd whose certificates and passwords are under `certs`."""
    return EtcdAccess(ca=certs / "ca.crt", cert=certs / f"etcd-{user}.crt", key=certs / f"etcd-{user}.key", user=user,
                      password=(certs / "passwords" / f"{user}.password").read_text().strip())


def client_env(certs: Path, user: str) -> dict[str, str]:
    """FABRIC_ETCD_* for a child process logging in as `user` to that test etcd."""
    return {"FABRIC_ETCD_CA": str(certs / "ca.crt"), "FABRIC_ETCD_CERT": str(certs / f"etcd-{user}.crt"),
            "FABRIC_ETCD_KEY": str(certs / f"etcd-{user}.key"), "FABRIC_ETCD_USER": user,
            "FABRIC_ETCD_PASSWORD_FILE": str(certs / "passwords" / f"{user}.password")}


def make_certs(root: Path, members: list[str]) -> Path:
    """The etcd CA, a server certificate per member and client certificates for root, fabricd and
    gateway, as `fabricd store issue-*` make them: all in ROOT/certs (returned)."""
    certs = root / "certs"
    for member in members:
        issue_server(root / "pki-state", member, ["127.0.0.1", "localhost"], certs)
    for role in ("root", "fabricd", "gateway"):
        issue_client(root / "pki-state", role, certs)
    return certs


def set_up_auth(certs: Path, endpoints: list[tuple[str, int]]) -> None:
    """Users, roles and auth on, by the code behind `fabricd store init-auth`."""
    tls = EtcdAccess(ca=certs / "ca.crt", cert=certs / "etcd-root.crt", key=certs / "etcd-root.key")
    init_auth(endpoints, tls, certs / "passwords")


class ClientsOf:
    """How processes reach a test etcd (a server or a cluster): ``secure``, ``certs`` and ``url``
    come from the class that mixes this in."""

    secure: bool
    certs: Path
    url: str

    def access(self, user: str = "fabricd") -> EtcdAccess | None:
        """How a process of this kind reaches it (None when it is plain)."""
        return client_access(self.certs, user) if self.secure else None

    def env(self, user: str = "fabricd") -> dict[str, str]:
        """FABRIC_ETCD_* for a child process logging in as `user` ({} when it is plain)."""
        return client_env(self.certs, user) if self.secure else {}

    def open(self, user: str = "fabricd") -> Store:
        return open_store(self.url, access=self.access(user))


class EtcdServer(ClientsOf):
    """``with EtcdServer() as srv:`` starts etcd; ``srv.url`` is ``etcd://127.0.0.1:PORT``."""

    def __init__(self, binary: str = ETCD_BINARY, *, secure: bool = True):
        self.binary = binary
        self.secure = secure
        self.host = "127.0.0.1"
        self.port = 0
        self.peer_port = 0
        self.data_dir: Path | None = None
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"etcd://{self.host}:{self.port}"

    @property
    def certs(self) -> Path:
        assert self.data_dir is not None
        return self.data_dir / "certs"

    def _set_up_auth(self) -> None:
        set_up_auth(self.certs, [(self.host, self.port)])

    def _make_certs(self) -> None:
        assert self.data_dir is not None
        make_certs(self.data_dir, ["fabric-test"])

    def start(self) -> EtcdServer:
        if not etcd_available():
            raise FileNotFoundError(f"etcd binary not found at {self.binary}")
        self.data_dir = Path(tempfile.mkdtemp(prefix="fabric-etcd-"))
        if self.secure:
            self._make_certs()
        # A port picked free can be taken before etcd binds it; retry a few times with new ports.
        for _attempt in range(3):
            self.port, self.peer_port = free_port(), free_port()
            self._spawn()
            if self._wait_healthy():
                if self.secure:
                    self._set_up_auth()
                return self
            self._kill()
        log = (self.data_dir / "etcd.log").read_text(errors="replace")[-2000:]
        self.stop()
        raise RuntimeError(f"etcd did not become healthy; log tail:\n{log}")

    def _spawn(self) -> None:
        assert self.data_dir is not None
        client = f"{'https' if self.secure else 'http'}://{self.host}:{self.port}"
        peer = f"http://{self.host}:{self.peer_port}"
        # A failed earlier attempt may have left raft state naming other ports: start clean.
        shutil.rmtree(self.data_dir / "data", ignore_errors=True)
        with open(self.data_dir / "etcd.log", "ab") as log:
            self.proc = self._popen(client, peer, log)

    def _popen(self, client: str, peer: str, log) -> subprocess.Popen:
        return subprocess.Popen(
            [
                self.binary,
                "--name", "fabric-test",
                "--data-dir", str(self.data_dir / "data"),
                "--listen-client-urls", client,
                "--advertise-client-urls", client,
                "--listen-peer-urls", peer,
                "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"fabric-test={peer}",
                "--initial-cluster-state", "new",
                # minimum lease TTL = ceil(1.5 * election timeout) -> 1 s with these.
                "--heartbeat-interval", "50",
                "--election-timeout", "500",
                "--log-level", "warn",
                *self._tls_flags(),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # A test run killed outright (timeout, ^C twice) must not leave etcd behind.
            preexec_fn=_die_with_parent,  # noqa: PLW1509 (one pre-resolved prctl call)
        )

    def _tls_flags(self) -> list[str]:
        if not self.secure:
            return []
        c = self.certs
        # bcrypt cost 4 (etcd's minimum): logins in tests cost ~1 ms instead of ~60 ms.
        return ["--cert-file", str(c / "fabric-test.crt"), "--key-file", str(c / "fabric-test.key"),
                "--client-cert-auth", "--trusted-ca-file", str(c / "ca.crt"), "--bcrypt-cost", "4"]

    def _wait_healthy(self) -> bool:
        deadline = time.monotonic() + START_TIMEOUT_S
        scheme = "https" if self.secure else "http"
        url = f"{scheme}://{self.host}:{self.port}/health"
        ctx = (client_ssl_context(self.certs / "ca.crt", self.certs / "etcd-root.crt", self.certs / "etcd-root.key")
               if self.secure else None)
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(url, timeout=1, context=ctx) as resp:
                    if b'"health":"true"' in resp.read():
                        return True
            except OSError:
                pass
            time.sleep(0.1)
        return False

    def _kill(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.proc = None

    def stop(self) -> None:
        self._kill()
        if self.data_dir is not None:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            self.data_dir = None

    def __enter__(self) -> EtcdServer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


@pytest.fixture(scope="session")
def etcd_server():
    """One etcd for the whole session; tests isolate themselves by key prefix."""
    if not etcd_available():
        pytest.skip(f"etcd binary not found at {ETCD_BINARY} (Debian package etcd-server)")
    with EtcdServer() as server:
        yield server
