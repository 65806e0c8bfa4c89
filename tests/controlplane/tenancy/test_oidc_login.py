"""OIDC login for the control plane: a real identity provider on loopback signs ID tokens; fabricd
verifies them against its JWKS and issues its own token with the role and tenant the claims name.
An inference-audience token, another client's, an unpublished key, an expired token or one without
a role never sign in."""

from __future__ import annotations

import time

import pytest

from common.errors import Forbidden
from controlplane.tenancy.oidc_login import OidcLoginSettings, principal_of
from tests.controlplane.tenancy.conftest import OIDC_CLIENT, OIDC_ISSUER


def _claims(**extra) -> dict:
    return {"iss": OIDC_ISSUER, "aud": OIDC_CLIENT, "sub": "alice", "exp": int(time.time()) + 300, **extra}


def _exchange(server, token: str):
    with server.client() as c:
        return c.post("/api/auth/oidc", json={"id_token": token})


def test_an_id_token_signs_in_with_its_role_and_tenant(tenancy_fabricd, idp):
    resp = _exchange(tenancy_fabricd, idp.sign(_claims(fabric_role="operator", fabric_tenant="a")))
    assert resp.status_code == 200, resp.text
    assert (resp.json()["role"], resp.json()["tenant"]) == ("operator", "a")
    with tenancy_fabricd.client(resp.json()["token"]) as c:
        assert c.get("/api/auth/whoami").json() == {"subject": "oidc:alice", "role": "operator", "tenant": "a"}
        assert c.get("/api/ai/nodes").json()["error"]["code"] == "cluster_scoped"  # bound to tenant a


@pytest.mark.parametrize("claims,kid,code", [
    (_claims(aud="fabric-inference", fabric_role="admin"), "k1", "invalid_audience"),
    (_claims(aud=[OIDC_CLIENT, "fabric-inference"], fabric_role="admin"), "k1", "invalid_audience"),
    (_claims(aud="another-client", fabric_role="admin"), "k1", "invalid_audience"),
    (_claims(iss="https://evil.test", fabric_role="admin"), "k1", "invalid_token"),
    (_claims(exp=int(time.time()) - 600, fabric_role="admin"), "k1", "token_expired"),
    (_claims(fabric_role="admin"), "k2", "invalid_token"),  # k2 is not published
    (_claims(), "k1", "no_role"),
    (_claims(fabric_role="root"), "k1", "no_role"),
])
def test_tokens_that_must_not_sign_in(tenancy_fabricd, idp, claims, kid, code):
    if code != "token_expired":  # the list is built at collection, perhaps long before this test runs
        claims = {**claims, "exp": int(time.time()) + 300}
    token = idp.sign(claims, kid)
    resp = _exchange(tenancy_fabricd, token)
    assert resp.status_code in (401, 403) and resp.json()["error"]["code"] == code
    assert token not in resp.text


def test_claim_mapping_is_pure():
    settings = OidcLoginSettings("i", "j", "c", role_claim="groups_role", tenant_claim="team")
    assert principal_of({"sub": "s", "groups_role": "viewer", "team": "t"}, settings).tenant == "t"
    assert principal_of({"sub": "s", "groups_role": "admin", "team": "t"}, settings).tenant is None
    with pytest.raises(Forbidden):
        principal_of({"sub": "s", "groups_role": "viewer", "team": "bad tenant!"}, settings)
