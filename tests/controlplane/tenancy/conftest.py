"""One real fabricd for the tenancy tests (package scope), with tokens for every kind of caller.

Tokens are minted with the server's own signing secret (read from its store, as a second
fabricd would) so the route walk can name any role and tenant; the users tests log in through
the real API instead. ``seed`` gives tenant "b" a model, profile, deployment and endpoint.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from common.store.connect import open_store
from controlplane.auth import ensure_token_secret, issue_token
from tests.controlplane.conftest import login, start_fabricd
from tests.support.oidc_idp import RotatingIdp

HMAC_SECRET = "tenancy-tests-hmac-secret-0123456789abcdef"
OIDC_ISSUER = "https://login.idp.test"
OIDC_CLIENT = "fabricd-console"
MODEL = {"source": "hf://Qwen/Qwen3-8B"}
PROFILE = {"runtime": "vllm", "gpu": {"count": 1, "vram_gib": 24}, "cpu": 8, "memory_gib": 32}


@dataclass(frozen=True)
class Caller:
    name: str
    role: str | None  # None: no token at all
    tenant: str | None = None

    @property
    def bound(self) -> bool:
        return self.role not in (None, "admin") and self.tenant is not None


CALLERS = (Caller("anonymous", None), Caller("viewer", "viewer"), Caller("operator", "operator"),
           Caller("viewer-a", "viewer", "a"), Caller("operator-a", "operator", "a"), Caller("admin", "admin"))


@pytest.fixture(scope="package")
def idp():
    provider = RotatingIdp(max_age=300, issuer=OIDC_ISSUER)
    yield provider
    provider.stop()


@pytest.fixture(scope="package")
def tenancy_fabricd(tmp_path_factory, idp):
    env = {"FABRIC_KEY_HMAC_SECRET": HMAC_SECRET, "FABRIC_ADMIT_TOKEN": "admit-secret-path-token-0123456789",
           "FABRIC_LOGIN_OIDC_ISSUER": OIDC_ISSUER, "FABRIC_LOGIN_OIDC_JWKS_URL": idp.jwks_url,
           "FABRIC_LOGIN_OIDC_CLIENT_ID": OIDC_CLIENT}
    with start_fabricd(tmp_path_factory.mktemp("tenancy"), env=env) as server:
        yield server


@pytest.fixture(scope="package")
def tokens(tenancy_fabricd) -> dict[str, str | None]:
    store = open_store(None, tenancy_fabricd.state_dir)
    try:
        secret = ensure_token_secret(store)
    finally:
        store.close()
    out: dict[str, str | None] = {}
    for c in CALLERS:
        out[c.name] = None if c.role is None else issue_token(secret, c.name, 3600, role=c.role, tenant=c.tenant)[0]
    out["admin"] = login(tenancy_fabricd)  # the real login's token is the admin one
    return out


def seed(client, tenant: str, tag: str) -> dict[str, str]:
    """A model, profile, deployment and endpoint of ``tenant`` (created by the admin client)."""
    names = {"model": f"m-{tag}", "profile": f"p-{tag}", "deployment": f"d-{tag}", "endpoint": f"e-{tag}"}
    for path, body in (("models", {"name": names["model"], **MODEL}),
                       ("profiles", {"name": names["profile"], **PROFILE}),
                       ("deployments", {"name": names["deployment"], "model": names["model"],
                                        "profile": names["profile"], "replicas": 1}),
                       ("endpoints", {"name": names["endpoint"], "deployment": names["deployment"]})):
        resp = client.post(f"/api/ai/{path}", json={**body, "tenant": tenant})
        assert resp.status_code == 201, resp.text
    return names
