"""Calls forwarded to a provider outside the cluster carry only an allow-list of the client's
headers (issue 37): through a real gateway to a loopback provider stand-in, the caller's
x-user-id, x-project-id, x-session-id, user-agent, cookies and SDK platform headers stay at the
gateway; content-type, accept and the gateway's request id leave, with the provider's key. Back
from the provider only an allow-list returns (issue 50): its set-cookie, organization and the
account's rate-limit headers stay at the gateway."""

from __future__ import annotations

import httpx

from common import keyspace
from common.schemas import EndpointStatus, ExternalProvider, InferenceEndpoint, ProviderKey
from gateway.provider_headers import provider_headers
from tests.gateway.gateway_harness import GatewayProcess, make_key, sqlite_state
from tests.gateway.test_gateway_capacity_routing import CHAT, Provider

ACCOUNT = {"set-cookie": "__cf_bm=secret; path=/", "openai-organization": "org-platform-account",
           "openai-project": "proj_platform", "x-ratelimit-remaining-requests": "4999",
           "x-ratelimit-limit-tokens": "2000000", "cf-ray": "8abc"}
PRIVATE = {"x-user-id": "alice", "x-project-id": "p1", "x-session-id": "s1", "user-agent": "MyApp/1.0",
           "cookie": "sid=1", "x-stainless-os": "Linux", "x-forwarded-for": "10.1.2.3"}


def test_only_allowed_headers_reach_an_external_provider(tmp_path_factory):
    state, url, store = sqlite_state(tmp_path_factory, "provider-headers")
    provider = Provider()
    provider.reply_headers = ACCOUNT
    keys = tmp_path_factory.mktemp("provider-keys")
    (keys / "key-c").write_text("key-c\n")
    gw = GatewayProcess.start(state, url, env={"FABRIC_PROVIDER_KEY_DIR": str(keys)})
    try:
        ext = InferenceEndpoint(name="ext", deployment="ext", status=EndpointStatus(phase="Ready"),
                                external=ExternalProvider(url=provider.url, model="provider-model",
                                                          keys=[ProviderKey(file=str(keys / "key-c"))]))
        store.put(keyspace.endpoints("ext"), ext.model_dump_json())
        _, key = make_key(store, "ext")
        r = httpx.post(f"{gw.openai_base('ext')}/chat/completions", json=CHAT, timeout=30,
                       headers={"authorization": f"Bearer {key}", "accept": "application/json", **PRIVATE})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "from provider", r.text
        sent = {k.lower(): v for k, v in provider.seen[-1]["headers"].items()}
        assert sent["authorization"] == "Bearer key-c" and sent["accept"] == "application/json"
        assert sent["content-type"] == "application/json" and sent["x-request-id"] == r.headers["x-fabric-request-id"]
        for name in PRIVATE:
            assert name not in sent or (name == "user-agent" and sent[name] != "MyApp/1.0"), (name, sent)
        assert key not in str(sent)
        for name in ACCOUNT:  # the platform's account, not the caller's call
            assert name not in r.headers, (name, dict(r.headers))
        assert r.headers["content-type"] == "application/json"
    finally:
        gw.stop()
        provider.server.shutdown()
        store.close()


def test_the_allow_list():
    raw = [(b"content-type", b"application/json"), (b"x-user-id", b"u"), (b"openai-beta", b"assistants=v2"),
           (b"user-agent", b"x"), (b"x-request-id", b"r")]
    assert provider_headers(raw) == [(b"content-type", b"application/json"), (b"openai-beta", b"assistants=v2"),
                                     (b"x-request-id", b"r")]
