"""POST /api/ai/admit tells a tenant nothing of another tenant's objects, and the admission
webhook's token (in its URL) never reaches fabricd's access log (issue 40)."""

from __future__ import annotations

import logging
import threading

import httpx
import uvicorn

from common.store.connect import open_store
from common.store.sqlite_store import SqliteStore
from controlplane.app import create_app
from controlplane.auth import ensure_admin_password, ensure_token_secret, issue_token
from controlplane.settings import FabricdSettings
from controlplane.state import AppState
from lab.rigs.polling import wait_for
from lab.rigs.servers import free_port
from tests.controlplane.conftest import login
from tests.controlplane.tenancy.conftest import MODEL, PROFILE


def test_admit_reads_another_tenants_model_as_missing(tenancy_fabricd, tokens):
    with tenancy_fabricd.client(tokens["admin"]) as admin:
        assert admin.post("/api/ai/models", json={"name": "priv-m", "tenant": "b", **MODEL}).status_code == 201
        assert admin.post("/api/ai/profiles", json={"name": "priv-p", **PROFILE}).status_code == 201
    body = {"name": "probe", "model": "priv-m", "profile": "priv-p", "replicas": 1}
    with tenancy_fabricd.client(tokens["operator-a"]) as a:
        theirs = a.post("/api/ai/admit", json=body).json()
        absent = a.post("/api/ai/admit", json={**body, "model": "priv-m-nope"}).json()
    assert theirs["allowed"] is False and absent["allowed"] is False
    assert theirs["reasons"] == [r.replace("priv-m-nope", "priv-m") for r in absent["reasons"]]
    assert "model 'priv-m' does not exist" in theirs["reasons"]
    with tenancy_fabricd.client(tokens["admin"]) as admin:  # a cluster-wide caller sees it
        seen = admin.post("/api/ai/admit", json={**body, "tenant": "b"}).json()
        assert not any("does not exist" in r for r in seen["reasons"])


def test_a_source_policy_does_not_tell_another_tenants_model_from_an_absent_one(tenancy_fabricd):
    """With allowed_source_prefixes set, the source rule judged the other tenant's model by its real
    source: an absent model got a refusal the other tenant's did not (its existence showed), and a
    source outside the prefixes would have been quoted. Both now read as a model with no source."""
    store = open_store(None, tenancy_fabricd.state_dir)
    try:
        caller = issue_token(ensure_token_secret(store), "ops-privc", 3600, role="operator", tenant="privc")[0]
    finally:
        store.close()
    with tenancy_fabricd.client(login(tenancy_fabricd)) as admin:
        assert admin.post("/api/ai/policies", json={"tenant": "privc", "allowed_source_prefixes": ["hf://Qwen/"]}
                          ).status_code == 201
        for name, source in (("privc-in", "hf://Qwen/Qwen3-8B"), ("privc-out", "hf://secret-org/private-model")):
            resp = admin.post("/api/ai/models", json={"name": name, "tenant": "b", "source": source})
            assert resp.status_code == 201, resp.text
        assert admin.post("/api/ai/profiles", json={"name": "privc-p", "tenant": "privc", **PROFILE}).status_code == 201
    with tenancy_fabricd.client(caller) as c:
        def reasons(model: str) -> list[str]:
            body = {"name": "probe", "model": model, "profile": "privc-p", "replicas": 1, "tenant": "privc"}
            verdict = c.post("/api/ai/admit", json=body).json()
            assert verdict["allowed"] is False
            return [r.replace(model, "M") for r in verdict["reasons"]]
        absent = reasons("privc-none")
        assert absent == reasons("privc-in") == reasons("privc-out")
    assert absent[:2] == ["model 'M' does not exist",
                          "model 'M' has no known source, outside tenant 'privc''s allowed_source_prefixes (hf://Qwen/)"]
    assert not any("secret-org" in r for r in absent)


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def test_the_admission_token_is_not_in_the_access_log(tmp_path):
    token = "admit-token-that-must-not-be-logged-0123"
    ensure_admin_password(tmp_path)
    store = SqliteStore(tmp_path / "fabric.db")
    state = AppState(store=store, state_dir=tmp_path, settings=FabricdSettings(run_controllers=False))
    captured = _Lines()
    access = logging.getLogger("uvicorn.access")
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(state), host="127.0.0.1", port=port, log_level="info"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        def started() -> bool:
            assert thread.is_alive()
            return server.started

        wait_for(started, 20, "uvicorn to start", interval=0.02)
        access.addHandler(captured)
        # Whether the token is right (it is not configured here: 404) the path is logged.
        assert httpx.post(f"http://127.0.0.1:{port}/api/ai/admit/{token}", json={"name": "x"}, timeout=10).status_code == 404
        httpx.post(f"http://127.0.0.1:{port}/api/ai/admit/{token}?q=1", json={"name": "x"}, timeout=10)
    finally:
        server.should_exit = True
        thread.join(10)
        access.removeHandler(captured)
        store.close()
    assert any("/api/ai/admit/<redacted>" in line for line in captured.lines), captured.lines
    assert not any(token in line for line in captured.lines)
