"""`fabricd store ...` sets a real etcd up as docs/store.md says (TLS, users, roles, auth on), a
second run changes nothing, and fabricd then works through it as the `fabricd` user; `fabricd
serve` and `fabric-gateway serve` refuse a bad FABRIC_ETCD_* value or a plain-HTTP store off
loopback with exit status 2 naming it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from lab.rigs.etcd_server import (
    ETCD_BINARY,
    EtcdServer,
    etcd_available,
    etcd_server,  # noqa: F401  (a fixture, used by name)
)
from lab.rigs.polling import clean_env
from tests.controlplane.conftest import BIN, login, start_fabricd


def fabricd(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "fabricd"), *args], capture_output=True, text=True, timeout=60,
                          env=clean_env(env))


@pytest.fixture
def bare_tls_etcd(tmp_path):
    """An etcd with client TLS whose certificates `fabricd store issue-*` made, auth still off."""
    if not etcd_available():
        pytest.skip(f"etcd binary not found at {ETCD_BINARY} (Debian package etcd-server)")
    state, certs = tmp_path / "state", tmp_path / "certs"
    assert fabricd("store", "issue-server", "--state-dir", str(state), "--out", str(certs), "--name", "fabric-test",
                   "--host", "127.0.0.1").returncode == 0
    for role in ("root", "fabricd"):
        done = fabricd("store", "issue-client", "--state-dir", str(state), "--out", str(certs), "--role", role)
        assert done.returncode == 0, done.stderr
    assert (certs / "etcd-fabricd.key").stat().st_mode & 0o777 == 0o600
    server = ProvidedCertsEtcd(certs)
    with server:
        yield server, certs


class ProvidedCertsEtcd(EtcdServer):
    """EtcdServer serving the certificates the CLI issued, with auth left to the test."""

    def __init__(self, certs: Path):
        super().__init__(secure=True)
        self._provided = certs

    def _make_certs(self) -> None:
        self.certs.symlink_to(self._provided)

    def _set_up_auth(self) -> None:
        pass


def test_init_auth_then_fabricd_runs_as_its_own_user(bare_tls_etcd, tmp_path):
    server, certs = bare_tls_etcd
    tls = {"FABRIC_ETCD_CA": str(certs / "ca.crt"), "FABRIC_ETCD_CERT": str(certs / "etcd-root.crt"),
           "FABRIC_ETCD_KEY": str(certs / "etcd-root.key")}
    passwords = tmp_path / "passwords"
    # the passwords first, as scripts/install-host makes them before etcd runs; a second call keeps them
    made = fabricd("store", "passwords", "--passwords", str(passwords))
    assert made.returncode == 0 and made.stdout.count(": made") == 3, made.stdout + made.stderr
    first_pw = (passwords / "fabricd.password").read_text()
    assert {(passwords / f"{u}.password").stat().st_mode & 0o777 for u in ("root", "fabricd", "gateway")} == {0o600}
    kept = fabricd("store", "passwords", "--passwords", str(passwords))
    assert kept.stdout.count(": kept") == 3 and (passwords / "fabricd.password").read_text() == first_pw
    init_auth = ("store", "init-auth", "--store", server.url, "--passwords", str(passwords))
    # --check (scripts/install-host's check) says what would change, exits 1, and writes nothing.
    checked = fabricd(*init_auth, "--check", env=tls)
    assert checked.returncode == 1, checked.stderr
    assert "would change: authentication enabled" in checked.stdout and "would change: role gateway added" in checked.stdout
    nowhere = tmp_path / "unmade"
    assert fabricd(*init_auth[:-1], str(nowhere), "--check", env=tls).returncode == 1 and not nowhere.exists()
    first = fabricd(*init_auth, env=tls)
    assert first.returncode == 0, first.stderr
    assert "authentication enabled" in first.stdout and "role gateway added" in first.stdout
    assert (passwords / "fabricd.password").read_text() == first_pw  # init-auth used the ones made before
    again = fabricd(*init_auth, env=tls)
    assert again.returncode == 0 and again.stdout.startswith("unchanged"), again.stdout + again.stderr
    checked = fabricd(*init_auth, "--check", env=tls)
    assert checked.returncode == 0 and checked.stdout.startswith("unchanged"), checked.stdout + checked.stderr
    env = {**tls, "FABRIC_ETCD_CERT": str(certs / "etcd-fabricd.crt"), "FABRIC_ETCD_KEY": str(certs / "etcd-fabricd.key"),
           "FABRIC_ETCD_USER": "fabricd", "FABRIC_ETCD_PASSWORD_FILE": str(passwords / "fabricd.password")}
    (tmp_path / "f").mkdir()
    with start_fabricd(tmp_path / "f", store=server.url, env=env) as api:
        client = api.client(login(api))
        r = client.post("/api/ai/models", json={"name": "m1", "source": "hf://org/m1"})
        assert r.status_code in (200, 201), r.text
        assert client.get("/api/ai/models/m1").json()["name"] == "m1"


def test_serve_refuses_bad_store_settings_with_exit_2(tmp_path):
    state = tmp_path / "state"
    assert fabricd("init", "--state-dir", str(state)).returncode == 0
    serve = ("serve", "--state-dir", str(state), "--listen", "127.0.0.1:1", "--insecure")
    plain = fabricd(*serve, "--store", "etcd://192.0.2.7:2379")
    assert plain.returncode == 2 and "--insecure-store" in plain.stderr and "192.0.2.7" in plain.stderr
    bad = fabricd(*serve, "--store", "etcd://127.0.0.1:2379", env={"FABRIC_ETCD_CA": str(tmp_path / "none.pem"),
                                                                     "FABRIC_ETCD_CERT": "x", "FABRIC_ETCD_KEY": "y"})
    assert bad.returncode == 2 and "FABRIC_ETCD_CA" in bad.stderr
    gateway = subprocess.run([str(BIN / "fabric-gateway"), "serve", "--state-dir", str(tmp_path / "gw"), "--listen",
                              "127.0.0.1:1", "--insecure", "--store", "etcd://192.0.2.7:2379"],
                             capture_output=True, text=True, timeout=60,
                             env=clean_env({"FABRIC_KEY_HMAC_SECRET": "k" * 32}))
    assert gateway.returncode == 2 and "--insecure-store" in gateway.stderr


def test_backup_create_reads_the_secured_store_as_fabricd(request, tmp_path):
    etcd = request.getfixturevalue("etcd_server")
    state, key = tmp_path / "state", tmp_path / "backup.key"
    assert fabricd("init", "--state-dir", str(state)).returncode == 0
    assert fabricd("backup", "keygen", "--key-file", str(key)).returncode == 0
    etcd.open("fabricd").put("/fabric/models/backed-up", "{}")
    env = {"FABRIC_KEY_HMAC_SECRET": "b" * 32, **etcd.env("fabricd")}
    done = fabricd("backup", "create", "--state-dir", str(state), "--key-file", str(key), "--store", etcd.url,
                   env=env)
    assert done.returncode == 0, done.stderr
    assert "store keys" in done.stdout and list((state / "backups").glob("fabric-backup-*.tar"))
    refused = fabricd("backup", "create", "--state-dir", str(state), "--key-file", str(key), "--store",
                      etcd.url, env={**env, "FABRIC_ETCD_PASSWORD_FILE": str(tmp_path / "none")})
    assert refused.returncode == 2 and "FABRIC_ETCD_PASSWORD_FILE" in refused.stderr
