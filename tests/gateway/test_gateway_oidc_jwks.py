"""The JWKS cache through a real gateway and an identity provider on loopback: a withdrawn key
stops verifying once the key set's Cache-Control max-age has passed, unknown kids cannot make the
gateway hammer the provider, a provider that hangs never stalls API-key callers (no JWKS fetch
in the thread pool that store calls share), and metric labels only ever name endpoints that
exist."""

from __future__ import annotations

import json
import threading
import uuid

import httpx
import pytest

from lab.rigs.polling import wait_for
from tests.gateway.gateway_harness import GatewayProcess, make_key, publish_endpoint, sim_engine, sqlite_state
from tests.support.oidc_idp import RotatingIdp

ISSUER = "https://idp.jwks.test"
SLOW_ISSUER = "https://slow.jwks.test"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    state, url, store = sqlite_state(tmp_path_factory, "jwks")
    idp = RotatingIdp(max_age=10)  # the gateway's floor for a key set's lifetime
    slow = RotatingIdp(max_age=300, issuer=SLOW_ISSUER, hang=True)
    engine = sim_engine()
    publish_endpoint(store, "chat", [engine])
    providers = json.dumps([{"issuer": ISSUER, "jwks_url": idp.jwks_url, "claims": ["tenant", "endpoints"]},
                            {"issuer": SLOW_ISSUER, "jwks_url": slow.jwks_url, "claims": ["tenant", "endpoints"]}])
    gw = GatewayProcess.start(state, url, {"FABRIC_OIDC_PROVIDERS": providers, "FABRIC_GATEWAY_CACHE_SECS": "0.2"})
    yield {"gw": gw, "idp": idp, "slow": slow, "store": store}
    slow.release.set()
    gw.stop()
    engine.stop()
    idp.server.shutdown()
    slow.server.shutdown()
    store.close()


def chat(gw, token: str, endpoint: str = "chat") -> int:
    return httpx.post(gw.openai_base(endpoint) + "/chat/completions", headers={"authorization": f"Bearer {token}"},
                      json={"model": "sim-m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
                      timeout=15).status_code


def test_unknown_kids_fetch_the_key_set_at_most_once_per_cooldown(env):
    gw, idp = env["gw"], env["idp"]
    assert chat(gw, idp.token("k1")) == 200
    before = idp.fetches
    for _ in range(30):  # random kids, each would have been a blocking JWKS fetch
        assert chat(gw, idp.token(kid=f"rnd-{uuid.uuid4().hex[:8]}", signer="k1")) == 401
    assert idp.fetches - before <= 1


def test_a_withdrawn_key_stops_verifying_after_the_max_age(env):
    gw, idp = env["gw"], env["idp"]
    assert chat(gw, idp.token("k1")) == 200
    idp.published = {"k2"}  # k1 withdrawn at the provider
    wait_for(lambda: chat(gw, idp.token("k1")) != 200, 40, "the withdrawn key to stop verifying", interval=0.5)
    assert chat(gw, idp.token("k2")) == 200


def test_a_hanging_identity_provider_never_stalls_api_key_callers(env):
    gw, slow = env["gw"], env["slow"]
    pending = [threading.Thread(target=chat, args=(gw, slow.token())) for _ in range(12)]
    for t in pending:
        t.start()
    try:
        assert slow.fetching.wait(15)
        # While the provider still holds the JWKS fetch, new API keys (each a store read) answer.
        for _ in range(3):
            _, key = make_key(env["store"], "chat")
            r = httpx.post(gw.openai_base("chat") + "/chat/completions", headers={"authorization": f"Bearer {key}"},
                           json={"model": "sim-m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
                           timeout=20)
            assert r.status_code == 200
        assert not slow.release.is_set() and slow.fetches == 1  # single-flight: one fetch for 12 callers
    finally:
        slow.release.set()
        for t in pending:
            t.join(30)


def test_metric_labels_name_only_resolved_endpoints(env):
    gw, idp = env["gw"], env["idp"]
    idp.published = {"k1", "k2"}
    for i in range(5):  # an authenticated caller allowed everywhere, naming endpoints that do not exist
        assert chat(gw, idp.token("k2", endpoints=["*"]), endpoint=f"made-up-{i}") == 404
    text = httpx.get(gw.url + "/metrics", timeout=5).text
    assert "made-up-" not in text
    assert 'endpoint="unknown"' in text
