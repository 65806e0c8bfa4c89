"""Inference OIDC tokens as identity providers issue them, through a real gateway with the official
openai client, against a JWKS served on loopback: Keycloak-shaped tokens (``realm_access.roles``,
``groups`` of paths such as ``/ml-team``) and Entra ID-shaped ones (``roles``, ``groups`` of
GUIDs) reach the endpoints their identity mappings name (stored in fabricd's records) and are
refused 403 in OpenAI's shape elsewhere; a token with only issuer, audience and ``tenant`` (or
``sub``) reaches its tenant's endpoints; ``fabric_endpoints`` still works; and a tenant's
``max_context_tokens`` refuses a longer prompt with 400 ``context_length_exceeded``."""

from __future__ import annotations

import json
import time
import uuid

import openai
import pytest

from common import keyspace
from common.identity_mappings import IdentityMapping
from common.records import identity_mappings, tenant_limits
from common.schemas import InferenceEndpoint
from common.tenant_limits import TenantLimits
from lab.rigs.polling import wait_for
from tests.gateway.gateway_harness import GatewayProcess, publish_endpoint, sim_engine, sqlite_state
from tests.support.oidc_idp import RotatingIdp

KEYCLOAK = "https://sso.example.test/realms/fabric"
ENTRA_TENANT = "8f1b2c3d-0000-4000-8000-00000000aaaa"
ENTRA = f"https://login.microsoftonline.test/{ENTRA_TENANT}/v2.0"
ML_GROUP_GUID = "3c5f6a7b-1111-4222-8333-444455556666"
OTHER_GROUP_GUID = "9d8e7f60-aaaa-4bbb-8ccc-dddd00001111"


def own(store, name: str, tenant: str) -> None:
    """Give the published endpoint an owner (what fabricd writes for a tenant's endpoint)."""
    ep = InferenceEndpoint.model_validate_json(store.get(keyspace.endpoints(name)).value)
    store.put(keyspace.endpoints(name), ep.model_copy(update={"tenant": tenant}).model_dump_json())


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    state, url, store = sqlite_state(tmp_path_factory, "oidc-mappings")
    keycloak, entra = RotatingIdp(max_age=300, issuer=KEYCLOAK), RotatingIdp(max_age=300, issuer=ENTRA)
    engine = sim_engine()
    for name in ("chat", "embed", "acme-chat", "vision"):
        publish_endpoint(store, name, [engine])
    own(store, "acme-chat", "acme")
    own(store, "vision", "vision-team")
    for m in (IdentityMapping(name="ml-team", claim="groups", value="/ml-team", endpoints=["chat"], issuer=KEYCLOAK),
              IdentityMapping(name="kc-embed", claim="realm_access.roles", value="embedder", endpoints=["embed"]),
              IdentityMapping(name="entra-ml", claim="groups", value=ML_GROUP_GUID, endpoints=["chat"], issuer=ENTRA),
              IdentityMapping(name="entra-vision", claim="roles", value="Fabric.Vision", tenant="vision-team")):
        identity_mappings.put(store, m)
    tenant_limits.put(store, TenantLimits(tenant="acme", max_context_tokens=64))
    providers = json.dumps([{"issuer": KEYCLOAK, "jwks_url": keycloak.jwks_url, "claims": ["tenant", "endpoints"]},
                            {"issuer": ENTRA, "jwks_url": entra.jwks_url}])  # Entra asserts no claim of ours
    gw = GatewayProcess.start(state, url, {"FABRIC_OIDC_PROVIDERS": providers, "FABRIC_GATEWAY_CACHE_SECS": "0.2"})
    yield {"gw": gw, "keycloak": keycloak, "entra": entra, "store": store}
    gw.stop()
    engine.stop()
    keycloak.stop()
    entra.stop()
    store.close()


def keycloak_token(idp: RotatingIdp, groups=(), roles=(), **extra) -> str:
    now = int(time.time())
    return idp.sign({"iss": KEYCLOAK, "aud": ["fabric-inference", "account"], "sub": str(uuid.uuid4()),
                     "exp": now + 300, "iat": now, "azp": "fabric-cli", "typ": "Bearer",
                     "preferred_username": "alice", "realm_access": {"roles": ["offline_access", *roles]},
                     "resource_access": {"account": {"roles": ["view-profile"]}}, "groups": list(groups), **extra})


def entra_token(idp: RotatingIdp, groups=(), roles=(), **extra) -> str:
    now = int(time.time())
    oid = str(uuid.uuid4())
    return idp.sign({"iss": ENTRA, "aud": "fabric-inference", "sub": "AAAAAAAAAAAAAAAAAAAAAIkzqFVrSaSaFHy782bbtaQ",
                     "oid": oid, "tid": ENTRA_TENANT, "ver": "2.0", "exp": now + 300, "iat": now, "nbf": now,
                     "name": "Bob", "roles": list(roles), "groups": list(groups), **extra})


def chat(env, token: str, endpoint: str, content: str = "hi", max_tokens: int | None = 2):
    client = openai.OpenAI(base_url=env["gw"].openai_base(endpoint), api_key=token, max_retries=0)
    extra = {"max_tokens": max_tokens} if max_tokens is not None else {}
    return client.chat.completions.create(model="sim-m", messages=[{"role": "user", "content": content}], **extra)


def refused(env, token: str, endpoint: str) -> openai.PermissionDeniedError:
    with pytest.raises(openai.PermissionDeniedError) as exc:
        chat(env, token, endpoint)
    assert exc.value.status_code == 403
    assert exc.value.body["code"] == "endpoint_not_allowed"  # OpenAI's shape: error.code, error.message
    assert exc.value.body["type"] and exc.value.body["message"]
    return exc.value


def test_keycloak_group_path_reaches_its_mapped_endpoint_only(env):
    token = keycloak_token(env["keycloak"], groups=["/ml-team", "/ml-team/interns"])
    assert chat(env, token, "chat").choices[0].message.content
    refused(env, token, "embed")
    refused(env, keycloak_token(env["keycloak"], groups=["/finance"]), "chat")  # an unmapped group


def test_keycloak_realm_role_maps_from_any_issuer(env):
    token = keycloak_token(env["keycloak"], roles=["embedder"])
    assert chat(env, token, "embed").choices
    refused(env, token, "chat")


def test_entra_group_guid_and_app_role(env):
    assert chat(env, entra_token(env["entra"], groups=[ML_GROUP_GUID]), "chat").choices
    refused(env, entra_token(env["entra"], groups=[OTHER_GROUP_GUID]), "chat")
    # The Keycloak group mapping is bound to Keycloak's issuer: an Entra token holding the same path gets nothing.
    refused(env, entra_token(env["entra"], groups=["/ml-team"]), "chat")
    # An app role mapped to a tenant: that tenant's endpoints, nobody else's.
    vision = entra_token(env["entra"], roles=["Fabric.Vision"])
    assert chat(env, vision, "vision").choices
    refused(env, vision, "acme-chat")


def test_issuer_and_audience_suffice_for_the_tenants_own_endpoints(env):
    acme = keycloak_token(env["keycloak"], tenant="acme")
    assert chat(env, acme, "acme-chat").choices
    refused(env, acme, "chat")
    # The attacks (issue 50, Medium 7): a sub equal to the tenant's name, and a tenant claim from
    # an issuer not configured to assert one, get nothing of acme's.
    by_sub = env["keycloak"].sign({"iss": KEYCLOAK, "aud": "fabric-inference", "sub": "acme",
                                   "exp": int(time.time()) + 300})
    refused(env, by_sub, "acme-chat")
    refused(env, entra_token(env["entra"], tenant="acme"), "acme-chat")
    refused(env, entra_token(env["entra"], fabric_endpoints=["acme-chat"]), "acme-chat")


def test_fabric_endpoints_claim_still_grants(env):
    token = keycloak_token(env["keycloak"], fabric_endpoints=["embed"])
    assert chat(env, token, "embed").choices
    refused(env, token, "vision")


def test_a_deleted_mapping_stops_granting_within_the_cache_ttl(env):
    identity_mappings.put(env["store"], IdentityMapping(name="tmp", claim="groups", value="/tmp-team",
                                                        endpoints=["vision"]))
    token = keycloak_token(env["keycloak"], groups=["/tmp-team"])
    def granted() -> bool:
        try:
            chat(env, token, "vision")
            return True
        except openai.PermissionDeniedError:
            return False

    # the gateway reads mappings through its cache (TTL 0.2 s here)
    wait_for(granted, 10, "the new mapping to grant", interval=0.1)
    identity_mappings.delete(env["store"], "tmp")
    wait_for(lambda: not granted(), 10, "the deleted mapping to stop granting", interval=0.1)


def test_tenant_max_context_tokens_is_bad_request_context_length_exceeded(env):
    acme = keycloak_token(env["keycloak"], tenant="acme")
    with pytest.raises(openai.BadRequestError) as exc:
        chat(env, acme, "acme-chat", content="x" * 400, max_tokens=8)  # ~100 prompt tokens > 64
    assert exc.value.body["code"] == "context_length_exceeded"
    assert "max_context_tokens is 64" in exc.value.body["message"]
    with pytest.raises(openai.BadRequestError):
        chat(env, acme, "acme-chat", content="x" * 40, max_tokens=60)  # 10 + 60 > 64
    assert chat(env, acme, "acme-chat", content="x" * 40, max_tokens=8).choices
    # No max_tokens: the default written into the body fits the tenant's context, so it passes.
    assert chat(env, acme, "acme-chat", content="x" * 40, max_tokens=None).choices
    # Another tenant is held only to FABRIC_MAX_CONTEXT.
    ml = keycloak_token(env["keycloak"], groups=["/ml-team"])
    assert chat(env, ml, "chat", content="x" * 400, max_tokens=8).choices
