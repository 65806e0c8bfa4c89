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
    return OidcClaims(subject=c["sub"], tenant=c.get("tenant"), issuer=c.pop("iss", KC),
                      endpoints=frozenset(c["fabric_endpoints"]) if "fabric_endpoints" in c else None, claims=c)


def test_claim_values_reads_lists_strings_and_paths():
    token = {"groups": ["/a", 3, "/b"], "scope": "openid chat", "realm_access": {"roles": ["r"]}}
    assert claim_values(token, "groups") == {"/a", "/b"}
    assert claim_values(token, "scope") == {"openid", "chat"}
    assert claim_values(token, "realm_access.roles") == {"r"}
    assert claim_values(token, "realm_access.roles.x") == frozenset()
    assert claim_values(token, "missing") == frozenset()


def test_tenant_precedence_claim_then_first_mapping_then_none():
    assert decide(claims(tenant="acme", groups=["/ml-team"]), MAPPINGS, OWNERS).tenant == "acme"
    # Two mappings name a tenant: the first by name wins (a-ml-other, any issuer).
    assert decide(claims(groups=["/ml-team"]), MAPPINGS, OWNERS).tenant == "other"
    assert decide(claims(groups=["/ml-team"], iss="https://other.test"), MAPPINGS[:1], OWNERS).tenant is None
    # The attack (issue 50, Medium 7): a user whose sub equals a tenant's name got its endpoints.
    by_sub = decide(claims(sub="acme"), (), OWNERS)
    assert by_sub.tenant is None and by_sub.endpoints == frozenset()


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


def test_an_issuer_asserts_only_the_claims_its_configuration_lists():
    """The attack (issue 50, Medium 7): any configured issuer's ``tenant`` claim named the tenant."""
    import asyncio

    import jwt
    from cryptography.hazmat.primitives.asymmetric import rsa

    from gateway.oidc import OidcVerifier
    from gateway.settings import OidcProvider, SettingsError

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pub = jwt.PyJWK.from_dict({**jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key(), as_dict=True), "kid": "k"})

    class Keys:
        async def key(self, provider, kid):
            return pub

    def verify(provider: OidcProvider, **extra) -> OidcClaims:
        token = jwt.encode({"iss": provider.issuer, "aud": "fabric-inference", "sub": "u-9", "exp": 2**31, **extra},
                           key, algorithm="RS256", headers={"kid": "k"})
        return asyncio.run(OidcVerifier((provider,), jwks=Keys()).verify(token))  # type: ignore[arg-type]

    social = OidcProvider("https://social.test", "https://social.test/jwks")  # asserts nothing
    got = verify(social, tenant="acme", fabric_endpoints=["*"])
    assert got.tenant is None and got.endpoints is None
    assert decide(got, (), OWNERS).endpoints == frozenset()
    corp = OidcProvider("https://corp.test", "https://corp.test/jwks", frozenset({"tenant", "endpoints"}))
    got = verify(corp, tenant="acme", fabric_endpoints=["x"])
    assert got.tenant == "acme" and got.endpoints == {"x"}
    assert load({"FABRIC_OIDC_ISSUER": "https://i", "FABRIC_OIDC_JWKS_URL": "https://i/j"}).oidc_providers[0].claims == set()
    assert load({"FABRIC_OIDC_PROVIDERS": '[{"issuer": "a", "jwks_url": "b", "claims": ["tenant"]}]'}
                ).oidc_providers[0].claims == {"tenant"}
    with pytest.raises(SettingsError, match="claims"):
        load({"FABRIC_OIDC_ISSUER": "https://i", "FABRIC_OIDC_JWKS_URL": "https://i/j", "FABRIC_OIDC_CLAIMS": "admin"})
