"""A fully preempted deployment through a real fabric-gateway: its endpoint answers 503
deployment_preempted naming who took the replicas (no Retry-After, not held, not "loading"), and an
endpoint with fallbacks sends a key that allows them to the fallback instead."""

from __future__ import annotations

import time

import httpx

from common import keyspace
from common.schemas import (
    DeploymentStatus,
    EndpointStatus,
    ExternalProvider,
    InferenceDeployment,
    InferenceEndpoint,
    ProviderKey,
)
from tests.gateway.gateway_harness import GatewayProcess, make_key, sqlite_state
from tests.gateway.test_gateway_capacity_routing import CHAT, Provider


def preempted(store, name: str, fallbacks: list[str] = ()) -> None:
    ep = InferenceEndpoint(name=name, deployment=f"{name}-dep", fallbacks=list(fallbacks),
                           status=EndpointStatus(phase="Ready"))
    store.put(keyspace.endpoints(name), ep.model_dump_json())
    dep = InferenceDeployment(name=f"{name}-dep", model="m", profile="p", replicas=2, capacity_class="opportunistic",
                              status=DeploymentStatus(phase="Preempted", preempted=2, preempted_by="chat",
                                                      message="all 2 replica(s) preempted by chat"))
    store.put(keyspace.deployments(dep.name), dep.model_dump_json())


def test_fully_preempted_is_a_503_naming_it_and_fallbacks_apply(tmp_path_factory):
    state, url, store = sqlite_state(tmp_path_factory, "preempted")
    provider = Provider()
    keys = tmp_path_factory.mktemp("provider-keys")
    (keys / "key-c").write_text("key-c\n")
    gw = GatewayProcess.start(state, url, env={"FABRIC_GATEWAY_HOLD_SECS": "20", "FABRIC_PROVIDER_KEY_DIR": str(keys)})
    try:
        preempted(store, "batch")
        _, key = make_key(store, "batch")
        t0 = time.monotonic()
        r = httpx.post(f"{gw.openai_base('batch')}/chat/completions", json=CHAT, timeout=30,
                       headers={"Authorization": f"Bearer {key}"})
        assert time.monotonic() - t0 < 15, "nothing is coming until room returns: not held"
        assert r.status_code == 503 and "retry-after" not in r.headers, r.text
        err = r.json()["error"]
        assert err["code"] == "deployment_preempted" and "taken by chat" in err["message"], err
        assert store.get(keyspace.demand("batch")) is None

        ext = InferenceEndpoint(name="ext", deployment="ext", external=ExternalProvider(
            url=provider.url, model="provider-model", keys=[ProviderKey(file=str(keys / "key-c"))]))
        store.put(keyspace.endpoints("ext"), ext.model_dump_json())
        preempted(store, "batch2", fallbacks=["ext"])
        _, leaving = make_key(store, "batch2", fallbacks=("ext",))
        r = httpx.post(f"{gw.openai_base('batch2')}/chat/completions", json=CHAT, timeout=30,
                       headers={"Authorization": f"Bearer {leaving}"})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "from provider", r.text
    finally:
        gw.stop()
        provider.server.shutdown()
        store.close()
