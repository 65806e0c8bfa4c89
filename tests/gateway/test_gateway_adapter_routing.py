"""LoRA adapters through real processes: a gateway in front of two fabric-engine-sim replicas that
serve vLLM's runtime LoRA API with room for two adapters each. Adapters load on demand, the least
recently used idle one is unloaded to make room, a replica's own state wins over the gateway's
record, and adapter names are model names for clients and keys (root /v1 included)."""

from __future__ import annotations

import httpx
import openai
import pytest

from common import keyspace
from common.schemas import InferenceDeployment, LoraAdapter, ModelArtifact
from lab.tiny_model import write_tiny_adapter
from tests.gateway.gateway_harness import gateway_over, make_key, publish_endpoint, sim_engine, sqlite_state

ADAPTERS = ["sql", "poem", "code", "legal", "med", "chem"]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    state, url, store = sqlite_state(tmp_path_factory, "lora")
    root = tmp_path_factory.mktemp("adapters")  # what the replicas see as /adapters
    for name in [*ADAPTERS, "x"]:
        write_tiny_adapter(root / name)
    engines = [sim_engine("--replica-id", f"lora-dep-{i}", "--max-loras", "2", "--lora-root", str(root))
               for i in range(2)]
    model = ModelArtifact(name="sim-m", source="hf://org/base", max_loaded_adapters=2,
                          adapters=[LoraAdapter(name=a, source=f"hf://org/{a}-lora") for a in ADAPTERS])
    store.put(keyspace.models("sim-m"), model.model_dump_json())
    dep = InferenceDeployment(name="lora-dep", model="sim-m", profile="p", replicas=2)
    store.put(keyspace.deployments("lora-dep"), dep.model_dump_json())
    publish_endpoint(store, "lora", engines)
    with gateway_over(state, url, store, engines, env={"FABRIC_GATEWAY_CACHE_SECS": "0.1"}) as gw:
        yield store, gw, engines


def loaded(engine) -> list[str]:
    return httpx.get(engine.url + "/sim/state").json()["lora"]["loaded"]


def ask(gw, key: str, model: str) -> tuple[httpx.Response, dict]:
    r = httpx.post(gw.openai_base("lora") + "/chat/completions", headers={"authorization": f"Bearer {key}"},
                   json={"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
    why = httpx.get(f"{gw.url}/api/ai/explain/request/{r.headers['x-fabric-request-id']}",
                    headers={"authorization": f"Bearer {key}"}).json()
    return r, why


def test_adapters_load_on_demand_and_the_lru_idle_one_makes_room(stack):
    store, gw, (e0, e1) = stack
    _, key = make_key(store, "lora")
    where = {}
    for name in ["sql", "poem", "code", "legal"]:  # four adapters fill both replicas
        r, why = ask(gw, key, name)
        assert r.status_code == 200 and r.json()["model"] == name and why["mode"] == "adapter" and why["loaded"]
        where[name] = r.headers["x-fabric-replica"]
    assert sorted(loaded(e0) + loaded(e1)) == sorted(where)
    assert len(loaded(e0)) == len(loaded(e1)) == 2
    r, why = ask(gw, key, "sql")  # held: no load
    assert r.headers["x-fabric-replica"] == where["sql"] and "loaded" not in why and why["reason"] == "holds the adapter"
    # Both replicas full: "med" unloads the least recently used idle adapter of a replica.
    r, why = ask(gw, key, "med")
    assert r.status_code == 200 and why["unloaded"] in ("poem", "code", "legal")
    engine = e0 if r.headers["x-fabric-replica"] == "lora-dep-0" else e1
    assert "med" in loaded(engine) and why["unloaded"] not in loaded(engine)
    assert httpx.get(engine.url + "/sim/state").json()["lora"]["unloads"] == 1
    r, _ = ask(gw, key, "sim-m")  # the base model is routed as before
    assert r.status_code == 200 and r.json()["model"] == "sim-m"


def test_the_replica_knows_better_than_the_gateway(stack):
    """Another gateway loaded adapters the gateway does not know of: the engine refuses the load,
    the gateway re-reads /v1/models, unloads an idle one and loads."""
    store, gw, engines = stack
    _, key = make_key(store, "lora")
    before = {e.port: loaded(e) for e in engines}  # what the gateway believes each holds
    for e in engines:  # make both replicas full behind the gateway's back
        for name in loaded(e):
            httpx.post(e.url + "/v1/unload_lora_adapter", json={"lora_name": name})
        for name in ("x-1", "x-2"):
            assert httpx.post(e.url + "/v1/load_lora_adapter",
                              json={"lora_name": f"{e.port}-{name}", "lora_path": "/adapters/x"}).status_code == 200
    r, why = ask(gw, key, "chem")
    assert r.status_code == 200 and r.json()["model"] == "chem", r.text
    engine = engines[0] if r.headers["x-fabric-replica"] == "lora-dep-0" else engines[1]
    assert "chem" in loaded(engine) and len(loaded(engine)) == 2 and why["loaded"]
    # On the other replica the gateway still believes its old adapters loaded: a call for one
    # gets the engine's 404, and the gateway loads it there (making room) and retries.
    other = engines[1] if engine is engines[0] else engines[0]
    stale = before[other.port][0]
    r, why = ask(gw, key, stale)
    assert r.status_code == 200 and r.json()["model"] == stale and why["reloaded"] and why["loaded"], why
    answered = engines[0] if r.headers["x-fabric-replica"] == "lora-dep-0" else engines[1]
    assert stale in loaded(answered) and all(len(loaded(e)) == 2 for e in engines)


def test_adapter_names_are_model_names_for_clients_and_keys(stack):
    store, gw, _ = stack
    _, scoped = make_key(store, "lora", model="code")
    c = openai.OpenAI(base_url=gw.url + "/v1", api_key=scoped, max_retries=0)
    assert [m.id for m in c.models.list().data] == ["code"]
    out = c.chat.completions.create(model="code", max_tokens=2, messages=[{"role": "user", "content": "hi"}])
    assert out.model == "code"
    with pytest.raises(openai.PermissionDeniedError):
        c.chat.completions.create(model="sql", max_tokens=2, messages=[{"role": "user", "content": "hi"}])
    _, key = make_key(store, "lora")
    names = [m.id for m in openai.OpenAI(base_url=gw.url + "/v1", api_key=key).models.list().data]
    assert names == sorted(["sim-m", *ADAPTERS])
