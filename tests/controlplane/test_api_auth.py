"""Authentication, TLS and `fabricd serve` refusals, through real fabricd processes."""

from __future__ import annotations

import os
import ssl
import stat
import subprocess
import time

import httpx
import jwt
import pytest

from common.errors import Unauthorized
from common.pki import client_ssl_context
from common.store.connect import open_store
from controlplane.auth import TOKEN_AUDIENCE, ensure_token_secret, issue_token, verify_token
from tests.controlplane.conftest import BIN, fabricd_env, login, start_fabricd

PROFILE = {"runtime": "vllm", "gpu": {"count": 1, "vram_gib": 24}, "cpu": 8, "memory_gib": 32}


def assert_401(resp, code: str) -> None:
    assert resp.status_code == 401, resp.text
    assert resp.json()["error"]["code"] == code
    assert resp.headers.get("www-authenticate") == "Bearer"


@pytest.mark.parametrize("path", ["/api/ai/models", "/api/ai/profiles", "/api/ai/deployments",
                                  "/api/ai/endpoints", "/api/ai/events"])
def test_every_ai_route_needs_a_token(fabricd, path):
    with fabricd.client() as anon:
        assert_401(anon.get(path), "no_token")
        if path != "/api/ai/events":
            assert_401(anon.post(path, json={}), "no_token")


def test_login_issues_an_expiring_token_and_wrong_password_is_401(fabricd):
    with fabricd.client() as anon:
        ok = anon.post("/api/auth/login", json={"username": "admin", "password": fabricd.password})
        assert ok.status_code == 200 and ok.json()["expires_at"] > time.time()
        bad = anon.post("/api/auth/login", json={"username": "admin", "password": "Zq9-not-it"})
        assert_401(bad, "bad_credentials")
        assert "Zq9-not-it" not in bad.text
        assert anon.post("/api/auth/login", json={"username": "admin"}).status_code == 422
    with fabricd.client(ok.json()["token"]) as c:
        assert c.get("/api/ai/models").status_code == 200


def test_forged_garbage_and_expired_tokens_are_401(fabricd):
    with fabricd.client("not-a-jwt") as c:
        assert_401(c.get("/api/ai/models"), "invalid_token")
    forged, _ = issue_token(b"someone-elses-secret" * 2, "admin", 3600)
    with fabricd.client(forged) as c:
        assert_401(c.get("/api/ai/models"), "invalid_token")
    store = open_store(None, fabricd.state_dir)
    try:
        secret = ensure_token_secret(store)  # the server's own secret, read from the shared store
    finally:
        store.close()
    expired, _ = issue_token(secret, "admin", 60, now=time.time() - 3600)
    with fabricd.client(expired) as c:
        resp = c.get("/api/ai/models")
        assert_401(resp, "token_expired")
        assert expired not in resp.text
    # A JWT for the inference gateway's audience, even signed with the right secret, is no admin token.
    wrong_aud = jwt.encode({"sub": "admin", "aud": "fabric-inference", "iss": "fabricd", "exp": time.time() + 600},
                           secret, algorithm="HS256")
    with fabricd.client(wrong_aud) as c:
        assert_401(c.get("/api/ai/models"), "invalid_token")


def test_verify_token_checks_expiry_against_the_given_clock():
    secret = b"k" * 32
    token, expires_at = issue_token(secret, "admin", 100, now=1000.0)
    assert expires_at == 1100.0
    assert verify_token(secret, token, now=1099.0) == "admin"
    with pytest.raises(Unauthorized):
        verify_token(secret, token, now=1100.0)
    assert jwt.decode(token, secret, algorithms=["HS256"], audience=TOKEN_AUDIENCE,
                      options={"verify_exp": False})["sub"] == "admin"


def test_init_writes_private_password_and_ca_and_is_idempotent(tmp_path):
    state = tmp_path / "s"
    cmd = [str(BIN / "fabricd"), "init", "--state-dir", str(state)]
    subprocess.run(cmd, check=True, capture_output=True, env=fabricd_env())
    password = (state / "admin-password").read_text()
    ca = (state / "pki" / "ca.crt").read_bytes()
    for secret_file in ("admin-password", "pki/ca.key", "pki/fabricd.key"):
        assert stat.S_IMODE(os.stat(state / secret_file).st_mode) == 0o600, secret_file
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=fabricd_env()).stdout
    assert (state / "admin-password").read_text() == password and (state / "pki" / "ca.crt").read_bytes() == ca
    assert password.strip() not in out  # init points at the file, never prints the password


def test_https_with_the_cluster_ca_and_runtime_allowlist(tmp_path):
    with start_fabricd(tmp_path, insecure=False, env={"FABRIC_ALLOW_RUNTIMES": "vllm,tei"}) as server:
        assert server.url.startswith("https://")
        token = login(server)  # verified against the cluster CA
        with server.client(token) as c:
            assert c.post("/api/ai/profiles", json={"name": "ok", **PROFILE}).status_code == 201
            resp = c.post("/api/ai/profiles", json={"name": "nope", **PROFILE, "runtime": "llama.cpp"})
            assert resp.status_code == 422
            assert "body.runtime:" in resp.json()["error"]["message"]
            assert "FABRIC_ALLOW_RUNTIMES" in resp.json()["error"]["message"]
        ctx = client_ssl_context(server.ca)
        with httpx.Client(base_url=server.url, verify=ctx) as c:
            assert c.get("/healthz").status_code == 200
        # Without the CA the certificate is not trusted: TLS is really on.
        with httpx.Client(base_url=server.url, verify=ssl.create_default_context()) as c, \
                pytest.raises(httpx.ConnectError):
            c.get("/healthz")
        with httpx.Client(base_url=server.url.replace("https://", "http://")) as c, pytest.raises(httpx.HTTPError):
            c.get("/healthz")


@pytest.mark.parametrize("listen", ["0.0.0.0:18443", "192.0.2.10:18443"])
def test_insecure_on_a_non_loopback_address_is_refused(tmp_path, listen):
    state = tmp_path / "s"
    subprocess.run([str(BIN / "fabricd"), "init", "--state-dir", str(state)], check=True, capture_output=True,
                   env=fabricd_env())
    proc = subprocess.run([str(BIN / "fabricd"), "serve", "--state-dir", str(state), "--listen", listen, "--insecure"],
                          capture_output=True, text=True, timeout=60, env=fabricd_env())
    assert proc.returncode == 2
    assert "loopback" in proc.stderr and listen.split(":")[0] in proc.stderr


def test_serve_without_init_is_refused(tmp_path):
    proc = subprocess.run([str(BIN / "fabricd"), "serve", "--state-dir", str(tmp_path / "none"),
                           "--listen", "127.0.0.1:18444", "--insecure"],
                          capture_output=True, text=True, timeout=60, env=fabricd_env())
    assert proc.returncode == 2 and "fabricd init" in proc.stderr
