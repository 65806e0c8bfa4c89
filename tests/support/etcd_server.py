"""A real etcd server for tests: free loopback ports, a temp data dir, cleaned up on exit.

Use the context manager directly, or the session-scoped pytest fixture:

    from tests.support.etcd_server import etcd_server   # noqa: F401  (re-export in a conftest)

    def test_x(etcd_server):
        store = open_store(etcd_server.url)

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

from tests.support.servers import free_port

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


class EtcdServer:
    """``with EtcdServer() as srv:`` starts etcd; ``srv.url`` is ``etcd://127.0.0.1:PORT``."""

    def __init__(self, binary: str = ETCD_BINARY):
        self.binary = binary
        self.host = "127.0.0.1"
        self.port = 0
        self.peer_port = 0
        self.data_dir: Path | None = None
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"etcd://{self.host}:{self.port}"

    def start(self) -> EtcdServer:
        if not etcd_available():
            raise FileNotFoundError(f"etcd binary not found at {self.binary}")
        self.data_dir = Path(tempfile.mkdtemp(prefix="fabric-etcd-"))
        # A port picked free can be taken before etcd binds it; retry a few times with new ports.
        for _attempt in range(3):
            self.port, self.peer_port = free_port(), free_port()
            self._spawn()
            if self._wait_healthy():
                return self
            self._kill()
        log = (self.data_dir / "etcd.log").read_text(errors="replace")[-2000:]
        self.stop()
        raise RuntimeError(f"etcd did not become healthy; log tail:\n{log}")

    def _spawn(self) -> None:
        assert self.data_dir is not None
        client = f"http://{self.host}:{self.port}"
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
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # A test run killed outright (timeout, ^C twice) must not leave etcd behind.
            preexec_fn=_die_with_parent,  # noqa: PLW1509 (one pre-resolved prctl call)
        )

    def _wait_healthy(self) -> bool:
        deadline = time.monotonic() + START_TIMEOUT_S
        url = f"http://{self.host}:{self.port}/health"
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(url, timeout=1) as resp:
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
