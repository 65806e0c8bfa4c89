"""Fixtures for control-plane tests: a real `fabricd` process on a free loopback port.

`start_fabricd(tmp, ...)` copies a `fabricd init` state (tests.support.fabricd_init) and runs
`fabricd serve` as a subprocess (the real console script from the venv), waits for /healthz and
stops the process on exit. The module-scoped `fabricd` fixture is plain HTTP on loopback with FABRIC_DENY_RUNTIMES=tei and
controllers off (so deletes are immediate); `admin_token` logs in through the real API.
"""

from __future__ import annotations

import ssl
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from enginesim.process import PortTaken, bind_failed, on_free_port
from lab.rigs.polling import clean_env, wait_for
from tests.support.fabricd_init import init_state

BIN = Path(sys.executable).parent
START_TIMEOUT_S = 30.0


@dataclass
class Fabricd:
    url: str
    state_dir: Path
    password: str
    ca: Path | None
    proc: subprocess.Popen

    def client(self, token: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        verify = ssl.create_default_context(cafile=str(self.ca)) if self.ca else True
        return httpx.Client(base_url=self.url, headers=headers, verify=verify, timeout=10)


fabricd_env = clean_env  # the name tests/controlplane imports


@contextmanager
def start_fabricd(tmp: Path, *, insecure: bool = True, env: dict[str, str] | None = None,
                  controllers: bool = False, store: str | None = None):
    state_dir = tmp / "state"
    init_state(state_dir)  # a copy of one `fabricd init` per run, with passwords of its own

    def serve(port: int) -> Fabricd:
        cmd = [str(BIN / "fabricd"), "serve", "--state-dir", str(state_dir), "--listen", f"127.0.0.1:{port}",
               "--log-level", "warning"]
        if not controllers:
            cmd.append("--no-controllers")
        if store is not None:  # e.g. several fabricd processes sharing one store
            cmd += ["--store", store]
        if insecure:
            cmd.append("--insecure")
        with open(tmp / "fabricd.log", "wb") as log:  # the child keeps its own copy of the descriptor
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=fabricd_env(env))
        scheme = "http" if insecure else "https"
        ca = None if insecure else state_dir / "pki" / "ca.crt"
        server = Fabricd(f"{scheme}://127.0.0.1:{port}", state_dir,
                         (state_dir / "admin-password").read_text().strip(), ca, proc)
        try:
            _wait_ready(server, tmp / "fabricd.log")
        except BaseException:
            _stop(proc)
            raise
        return server

    server = on_free_port(serve)
    try:
        yield server
    finally:
        _stop(server.proc)


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _wait_ready(server: Fabricd, log: Path) -> None:
    with server.client() as c:
        def ready() -> bool:
            if server.proc.poll() is not None:
                out = log.read_text()[-2000:]
                raise (PortTaken if bind_failed(out) else RuntimeError)(f"fabricd exited {server.proc.returncode}: {out}")
            try:
                return c.get("/healthz").status_code == 200
            except httpx.TransportError:
                return False

        wait_for(ready, START_TIMEOUT_S, f"fabricd to become ready (log: {log})", interval=0.1)


def login(server: Fabricd) -> str:
    with server.client() as c:
        resp = c.post("/api/auth/login", json={"username": "admin", "password": server.password})
        resp.raise_for_status()
        return resp.json()["token"]


@pytest.fixture(scope="module")
def fabricd(tmp_path_factory):
    with start_fabricd(tmp_path_factory.mktemp("fabricd"), env={"FABRIC_DENY_RUNTIMES": "tei"}) as server:
        yield server


@pytest.fixture(scope="module")
def admin_token(fabricd) -> str:
    return login(fabricd)


@pytest.fixture
def api(fabricd, admin_token):
    with fabricd.client(admin_token) as c:
        yield c
