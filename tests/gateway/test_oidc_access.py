"""gateway.oidc_access.decide and common.identity_mappings, as plain data: which endpoints and
tenant a verified token gets from its claim, its mappings and its tenant's ownership."""

from __future__ import annotations

import pytest

from common.errors import Forbidden
from common.identity_mappings import IdentityMapping, claim_values
from gateway.oidc import OidcClaims
from gateway.oidc_access import check_endpoint, decide
from gateway.settings import load

KC = "https://sso.example.test/realms/fabric"
OWNERS = {"acme-chat": "acme", "ml-chat": "ml", "shared": None}
MAPPINGS = (
    IdentityMapping(name="b-ml", claim="groups", value="/ml-team", tenant="ml", issuer=KC),
    IdentityMapping(name="a-ml-other", claim="groups", value="/ml-team", tenant="other"),
    IdentityMapping(name="c-role", claim="resource_access.fabric.roles", value="chat", endpoints=["shared"]),
)


def claims(**c) -> OidcClaims:
    c.setdefault("sub", "u-1")
    return OidcClaims(subject=c["sub"], tenant=str(c.get("tenant") or c["sub"]), issuer=c.pop("iss", KC),
                      endpoints=frozenset(c["fabric_endpoints"]) if "fabric_endpoints" in c else None, claims=c)


def test_claim_values_reads_lists_strings_and_paths():
    token = {"groups": ["/a", 3, "/b"], "scope": "openid chat", "realm_access": {"roles": ["r"]}}
    assert claim_values(token, "groups") == {"/a", "/b"}
    assert claim_values(token, "scope") == {"openid", "chat"}
    assert claim_values(token, "realm_access.roles") == {"r"}
    assert claim_values(token, "realm_access.roles.x") == frozenset()
    assert claim_values(token, "missing") == frozenset()


def test_tenant_precedence_claim_then_first_mapping_then_sub():
    assert decide(claims(tenant="acme", groups=["/ml-team"]), MAPPINGS, OWNERS).tenant == "acme"
    # Two mappings name a tenant: the first by name wins (a-ml-other, any issuer).
    assert decide(claims(groups=["/ml-team"]), MAPPINGS, OWNERS).tenant == "other"
    assert decide(claims(groups=["/ml-team"], iss="https://other.test"), MAPPINGS[:1], OWNERS).tenant == "u-1"
    assert decide(claims(sub="acme"), (), OWNERS).endpoints == {"acme-chat"}


def test_endpoints_are_the_union_of_claim_mappings_and_ownership():
    grant = decide(claims(tenant="ml", fabric_endpoints=["x"], resource_access={"fabric": {"roles": ["chat"]}}),
                   MAPPINGS, OWNERS)
    assert grant.endpoints == {"x", "shared", "ml-chat"} and grant.mappings == ("c-role",)
    assert decide(claims(tenant="ml"), MAPPINGS, OWNERS, by_ownership=False).endpoints == frozenset()
    check_endpoint(grant, "ml-chat", "fabric_endpoints")
    with pytest.raises(Forbidden) as exc:
        check_endpoint(grant, "acme-chat", "fabric_endpoints")
    assert exc.value.code == "endpoint_not_allowed"
    assert decide(claims(fabric_endpoints=["*"]), (), {}).endpoints == {"*"}


def test_a_mapping_must_grant_something_and_its_claim_is_a_path():
    with pytest.raises(ValueError, match="endpoints"):
        IdentityMapping(name="x", claim="roles", value="r")
    with pytest.raises(ValueError, match="claim"):
        IdentityMapping(name="x", claim="roles[0]", value="r", endpoints=["a"])


def test_tenant_ownership_can_be_turned_off():
    assert load({}).oidc_tenant_endpoints is True
    assert load({"FABRIC_OIDC_TENANT_ENDPOINTS": "0"}).oidc_tenant_endpoints is False
