"""The gateway's KV-index source (gateway/kv_source.py) against the agent's real routes
(agent/kv_index/routes.py) over an in-process transport: tokenizers found from the deployment's
model record and the agent's model cache without any setting, the override directory, the
simulator's answer, a changed digest; blind replicas made visible (gateway/kv_blind.py):
gauge, counter, one event per change, the explanation's fields, and the gauge kept right without
traffic by the refresh; a rollout to another model routing the old revision approximately."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from agent.kv_index.routes import kv_index_router, tokenizer_files
from common import keyspace
from common.kv_events import BlockHasher
from common.model_manifest import build_manifest
from common.records.events import recent_events
from common.schemas import (
    EndpointStatus,
    InferenceDeployment,
    InferenceEndpoint,
    ModelArtifact,
    ModelStatus,
    Node,
    Replica,
    ReplicaObservation,
)
from common.store.connect import open_store
from gateway.engine_hash import EngineTokenizer, RequestHasher, SimTokenizer
from gateway.kv_blind import BlindWatch, store_event_writer
from gateway.kv_source import AgentKvSource
from gateway.replica_router import ReplicaRouter
from gateway.tokenize_pool import PooledHasher, TokenizePool
from gateway.upstreams import EndpointView, UpstreamCache
from lab.rigs.routing_plans import publish_plans
from lab.tiny_model import write_tiny_model

D1, D2 = "a" * 64, "b" * 64
CHAT = {"model": "m", "messages": [{"role": "system", "content": "You answer briefly. " * 40},
                                   {"role": "user", "content": "hello"}]}


class Sub:
    """The agent's subscriber as the routes read it: fixed states and matches."""

    def __init__(self, states: dict[str, str], matched: dict[str, int | None], sizes: dict[str, int] | None = None):
        self.states_now, self.matched, self.sizes = states, matched, sizes or {}

    def match(self, hashes, replicas):
        return {r: self.matched.get(r) for r in replicas}

    def block_sizes(self, replicas):
        return {r: self.sizes.get(r, 16) for r in replicas}

    def states(self, replicas, blind_after_s):
        return {r: self.states_now.get(r, "unwatched") for r in replicas}

    def evicting(self, replicas, window_s):
        return {r: False if self.states_now.get(r) == "live" else None for r in replicas}


def _agent(sub: Sub, models: dict, simulated: bool = False):
    app = FastAPI()
    app.include_router(kv_index_router(sub, model_dir=models.get, simulated=simulated,
                                       manifest=lambda d: build_manifest(models[d]).text() if d in models else None))
    seen: list[str] = []

    async def counted(scope, receive, send):
        if scope["type"] == "http":
            seen.append(scope["path"])
        await app(scope, receive, send)

    return httpx.AsyncClient(transport=httpx.ASGITransport(app=counted)), seen


def _store(tmp_path, digest: str | None = D1):
    store = open_store(f"sqlite://{tmp_path}/s.db")
    store.put(keyspace.nodes("n"), Node(id="n", address="http://agent-n:9000").model_dump_json())
    store.put(keyspace.deployments("d"), InferenceDeployment(name="d", model="m", profile="p").model_dump_json())
    store.put(keyspace.models("m"), ModelArtifact(name="m", source="hf://o/m", status=ModelStatus(
        phase="Ready", digest=digest)).model_dump_json())
    return store


def _view(n: int = 2) -> EndpointView:
    ep = InferenceEndpoint(name="e", deployment="d", routing_l7="prefix", status=EndpointStatus())
    reps = tuple(Replica(replica_id=f"r{i}", deployment="d", ordinal=i, node="n", host=f"10.0.0.{i + 1}",
                         ready=True) for i in range(n))
    return EndpointView(ep, reps, {})


def test_the_tokenizer_comes_from_the_model_record_and_the_agents_cache(tmp_path):
    model = write_tiny_model(tmp_path / "model")
    digest = build_manifest(model).digest
    store = _store(tmp_path, digest)
    client, seen = _agent(Sub({"r0": "live", "r1": "live"}, {"r0": 0, "r1": 0}), {digest: model})
    src = AgentKvSource(UpstreamCache(store, ttl_secs=0), client, None, timeout_s=5, pool=TokenizePool(workers=1, deadline_s=30))
    hasher = asyncio.run(src.hasher(_view()))
    want = RequestHasher(EngineTokenizer.from_model_dir(model), BlockHasher(16)).request_hashes(CHAT)
    assert hasher is not None and asyncio.run(hasher.hash_request(CHAT)) == want  # hashed in a worker
    assert len(want) > 2  # the rendered chat spans several blocks
    assert seen == [f"/v1/kv-index/tokenizer/{digest}"]
    asyncio.run(src.hasher(_view()))
    assert seen == [f"/v1/kv-index/tokenizer/{digest}"]  # kept while the digest stays
    store.close()


def test_tokenizer_files_a_node_changed_are_refused(tmp_path):
    """The attack: a compromised node serves its own chat template under the model's digest."""
    model = write_tiny_model(tmp_path / "model")
    digest = build_manifest(model).digest
    store = _store(tmp_path, digest)
    client, seen = _agent(Sub({}, {}), {digest: model})
    config = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": "{{ 'x' }}"}))
    src = AgentKvSource(UpstreamCache(store, ttl_secs=0), client, None, timeout_s=5)
    assert asyncio.run(src.hasher(_view())) is None and seen == [f"/v1/kv-index/tokenizer/{digest}"]
    _, why = asyncio.run(ReplicaRouter(kv=src).apick(_view(), CHAT, 0.0))
    assert why["kv_index"] == "approximate: no tokenizer for this model"
    store.close()


def test_a_new_digest_fetches_again_and_a_missing_one_routes_approximately(tmp_path):
    import gateway.kv_source as ks

    model = write_tiny_model(tmp_path / "model")
    d1 = build_manifest(model).digest
    store = _store(tmp_path, digest=None)
    client, seen = _agent(Sub({}, {}), {d1: model})
    src = AgentKvSource(UpstreamCache(store, ttl_secs=0), client, None, timeout_s=5)
    assert asyncio.run(src.hasher(_view())) is None and seen == []  # no verified digest: nothing to ask
    store.put(keyspace.models("m"), ModelArtifact(name="m", source="hf://o/m", status=ModelStatus(
        phase="Ready", digest=D2)).model_dump_json())
    src._tokenizers["d"].check_at = 0  # RETRY_S passed
    assert asyncio.run(src.hasher(_view())) is None and seen == [f"/v1/kv-index/tokenizer/{D2}"]  # not cached: 404
    store.put(keyspace.models("m"), ModelArtifact(name="m", source="hf://o/m", status=ModelStatus(
        phase="Ready", digest=d1)).model_dump_json())
    src._tokenizers["d"].check_at = 0
    assert asyncio.run(src.hasher(_view())) is not None and seen[-1] == f"/v1/kv-index/tokenizer/{d1}"
    assert ks.CHECK_S > 0 and src._tokenizers["d"].digest == d1
    store.close()


def test_the_override_directory_wins_and_a_simulator_node_answers_sim(tmp_path):
    store = _store(tmp_path)
    client, seen = _agent(Sub({}, {}), {}, simulated=True)
    src = AgentKvSource(UpstreamCache(store, ttl_secs=0), client, None, timeout_s=5)
    assert isinstance(asyncio.run(src.hasher(_view())).tokenizer, SimTokenizer)
    assert seen == [f"/v1/kv-index/tokenizer/{D1}"]
    model = write_tiny_model(tmp_path / "tok" / "d")
    over = AgentKvSource(UpstreamCache(store, ttl_secs=0), client, tmp_path / "tok", timeout_s=5)
    assert isinstance(asyncio.run(over.hasher(_view())), PooledHasher)  # a model's files: hashed in the pool
    assert seen == [f"/v1/kv-index/tokenizer/{D1}"]  # the override asked nobody
    assert set(tokenizer_files(model)) == {"tokenizer.json", "tokenizer_config.json"}
    store.close()


def test_the_tokenizer_route_names_what_is_wrong(tmp_path):
    from fastapi.responses import JSONResponse
    from fastapi.testclient import TestClient

    from common.errors import FabricError

    async def _err(_req, exc):  # as agent/api.py renders FabricErrors
        return JSONResponse(exc.to_body(), status_code=exc.status)

    app = FastAPI()
    app.include_router(kv_index_router(Sub({}, {}), model_dir={}.get))
    app.add_exception_handler(FabricError, _err)

    c = TestClient(app)
    bad = c.get("/v1/kv-index/tokenizer/nothex")
    assert bad.status_code == 422 and "digest" in bad.json()["error"]["message"]
    missing = c.get(f"/v1/kv-index/tokenizer/{D1}")
    assert missing.status_code == 404 and "not in this node's cache" in missing.json()["error"]["message"]
    empty = tmp_path / "empty"
    empty.mkdir()
    app2 = FastAPI()
    app2.include_router(kv_index_router(Sub({}, {}), model_dir={D1: empty}.get))
    app2.add_exception_handler(FabricError, _err)
    r = TestClient(app2).get(f"/v1/kv-index/tokenizer/{D1}")
    assert r.status_code == 404 and "no tokenizer.json" in r.json()["error"]["message"]


def _blind_setup(store, views_store=None):
    """r0 live, r1 blind, behind a source whose blind watch exports to its own registry (the
    endpoint views read ``views_store``, the same store by default)."""
    sub = Sub({"r0": "live", "r1": "blind"}, {"r0": 3, "r1": None})
    client, seen = _agent(sub, {}, simulated=True)
    registry = CollectorRegistry()
    src = AgentKvSource(UpstreamCache(views_store or store, ttl_secs=0), client, None, timeout_s=5,
                        blind=BlindWatch.exported(registry, store_event_writer(store, "gw-1")))
    return sub, seen, registry, src, ReplicaRouter(kv=src)


def test_a_blind_replica_shows_in_metrics_events_and_the_explanation(tmp_path):
    store = _store(tmp_path)
    sub, _, registry, src, router = _blind_setup(store)
    view = _view()
    for _ in range(3):
        _, why = asyncio.run(router.apick(view, CHAT, 0.0))
    assert why["kv_index"] == "precise" and why["kv_blind"] == ["r1"]
    assert why["kv_states"] == {"r0": "live", "r1": "blind"}
    assert registry.get_sample_value("fabric_gateway_kv_blind_replicas", {"endpoint": "e"}) == 1.0
    assert registry.get_sample_value("fabric_gateway_kv_blind_calls_total", {"endpoint": "e"}) == 3.0
    events = recent_events(store, kind="replica")
    assert [(e.name, e.action, e.type) for e in events] == [("r1", "KvEventsMissing", "Warning")]  # once, not per call
    assert "gw-1" in events[0].message and "--kv-events-config" in events[0].message
    sub.states_now["r1"] = "live"
    sub.matched["r1"] = 0
    _, why = asyncio.run(router.apick(view, CHAT, 0.0))
    assert why["kv_blind"] == []
    assert registry.get_sample_value("fabric_gateway_kv_blind_replicas", {"endpoint": "e"}) == 0.0
    assert [e.action for e in recent_events(store, kind="replica")] == ["KvEventsMissing", "KvEventsResumed"]
    store.close()


def test_a_warming_or_unanswered_replica_is_not_called_blind():
    seen = []
    watch = BlindWatch(write_event=lambda *a: seen.append(a))
    assert watch.observe("e", {"r0": "warming", "r1": "no_answer", "r2": "unwatched", "r3": "refused"}) == []
    assert seen == []
    assert watch.observe("e", {"r0": "blind"}) == ["r0"] and len(seen) == 1
    assert watch.observe("e", {"r0": "warming"}) == [] and len(seen) == 1  # not known either way: no event


def test_the_agents_client_certificate_settings_need_all_three(tmp_path):
    import pytest

    from gateway.settings import SettingsError, load

    base = {"FABRIC_KEY_HMAC_SECRET": "x"}
    cert = tmp_path / "gw.crt"
    cert.write_text("")
    with pytest.raises(SettingsError) as err:
        load({**base, "FABRIC_GATEWAY_KV_CLIENT_CERT": str(cert)})
    assert "FABRIC_GATEWAY_KV_CLIENT_KEY" in str(err.value) and "FABRIC_GATEWAY_KV_CA" in str(err.value)
    assert load(base).kv_agent_tls.enabled is False
    full = {f"FABRIC_GATEWAY_KV_{n}": str(cert) for n in ("CLIENT_CERT", "CLIENT_KEY", "CA")}
    tls = load({**base, **full}).kv_agent_tls
    assert tls.enabled is True and tls.client_cert == str(cert)


def test_a_broken_answer_or_record_routes_approximately_instead_of_failing(tmp_path):
    store = _store(tmp_path)

    async def garbage(scope, receive, send):  # an agent answering 200 with no JSON
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"not json"})

    src = AgentKvSource(UpstreamCache(store, ttl_secs=0), httpx.AsyncClient(transport=httpx.ASGITransport(app=garbage)), None, timeout_s=5)
    assert asyncio.run(src.hasher(_view())) is None
    store.put(keyspace.deployments("d"), "{not a record")
    src._tokenizers.clear()
    assert asyncio.run(src.hasher(_view())) is None
    _, why = asyncio.run(ReplicaRouter(kv=src).apick(_view(), CHAT, 0.0))
    assert why["kv_index"] == "approximate: no tokenizer for this model"
    store.close()


def _stored_endpoint(store, replicas: list[Replica]) -> None:
    store.put(keyspace.endpoints("e"), InferenceEndpoint(name="e", deployment="d", routing_l7="prefix",
                                                         status=EndpointStatus()).model_dump_json())
    for r in replicas:
        store.put(keyspace.replicas("d", r.replica_id), r.model_dump_json())
        store.put(keyspace.observations(r.replica_id), ReplicaObservation(
            replica_id=r.replica_id, scraped_at=time.time(), ok=True).model_dump_json())
    publish_plans(store)  # the routing controller's plan: the replicas the gateway reads


def test_the_blind_gauge_follows_the_replicas_without_traffic(tmp_path):
    import time

    from gateway.kv_source import REFRESH_S
    from lab.rigs.scale import CountingStore

    store = _store(tmp_path)
    view = _view()
    _stored_endpoint(store, list(view.replicas))
    counting = CountingStore(store)  # what the views read
    sub, seen, registry, src, router = _blind_setup(store, counting)

    async def one_call() -> bool:
        await router.apick(view, CHAT, 0.0)
        return src._refresher is not None and not src._refresher.done()

    assert asyncio.run(one_call())  # the first match starts the periodic refresh

    def gauge():
        return registry.get_sample_value("fabric_gateway_kv_blind_replicas", {"endpoint": "e"})

    def refreshed():
        asyncio.run(src.refresh(now=time.monotonic() + REFRESH_S + 1))

    assert gauge() == 1.0
    asked = len(seen)
    asyncio.run(src.refresh())  # asked just now by the call: nothing to do
    assert len(seen) == asked
    sub.states_now["r1"] = "live"  # its engine now sends events; no call comes
    refreshed()  # the first reads the views' mirror: its first fetch lists each prefix once
    assert gauge() == 0.0 and len(seen) == asked + 1
    lists = counting.calls.get("list", 0)
    sub.states_now["r0"] = "blind"
    refreshed()
    assert gauge() == 1.0
    assert counting.calls.get("list", 0) == lists  # the view came from the mirror: no list of the store
    assert [(e.name, e.action) for e in recent_events(store, kind="replica")] == [
        ("r1", "KvEventsMissing"), ("r1", "KvEventsResumed"), ("r0", "KvEventsMissing")]
    assert registry.get_sample_value("fabric_gateway_kv_blind_calls_total", {"endpoint": "e"}) == 1.0  # calls only
    store.delete(keyspace.replicas("d", "r0"))  # the blind replica is replaced
    refreshed()
    assert gauge() == 0.0 and src.states(_view(1)) == {"r0": "no_answer"}
    store.delete(keyspace.endpoints("e"))
    refreshed()
    assert gauge() is None  # a deleted endpoint keeps no series
    store.close()


def test_a_rollout_to_another_model_routes_the_old_revision_approximately(tmp_path):
    from common.rollouts import Revision
    from common.schemas import Template

    store = _store(tmp_path)
    # Revision 2 moved the deployment from model "old" to "m"; r1 still runs revision 1.
    store.put(keyspace.deployments("d"), InferenceDeployment(name="d", model="m", profile="p",
                                                             revision=2).model_dump_json())
    for rev, model in ((1, "old"), (2, "m")):
        store.put(keyspace.revisions("d", rev), Revision(deployment="d", revision=rev, template=Template(
            model=model, profile="p")).model_dump_json())
    ep = InferenceEndpoint(name="e", deployment="d", routing_l7="prefix", status=EndpointStatus())
    reps = (Replica(replica_id="r0", deployment="d", ordinal=0, revision=2, node="n", host="10.0.0.1", ready=True),
            Replica(replica_id="r1", deployment="d", ordinal=1, revision=1, node="n", host="10.0.0.2", ready=True),
            Replica(replica_id="r2", deployment="d", ordinal=2, revision=3, node="n", host="10.0.0.3", ready=True))
    view = EndpointView(ep, reps, {})
    sub = Sub({"r0": "live", "r1": "live", "r2": "live"}, {"r0": 0, "r1": 5, "r2": 0})
    client, _ = _agent(sub, {}, simulated=True)
    asked: list[list[str]] = []
    real_post = client.post

    async def post(url, **kw):
        asked.append(kw["json"]["replicas"])
        return await real_post(url, **kw)

    client.post = post  # type: ignore[method-assign]
    src = AgentKvSource(UpstreamCache(store, ttl_secs=0), client, None, timeout_s=5)
    _, why = asyncio.run(ReplicaRouter(kv=src).apick(view, CHAT, 0.0))
    assert why["kv_index"] == "precise"
    # r1's engine holds blocks of the old model: not asked, scored by the approximate tree.
    # r2's revision record is missing: its model is unknown, so the same.
    assert asked == [["r0"]]
    assert why["kv_states"] == {"r0": "live", "r1": "other_model", "r2": "other_model"}
    assert why["kv_other_model"] == ["r1", "r2"] and why["blind_replicas"] == ["r1", "r2"]
    assert why["kv_blind"] == []  # not blind: its events are fine, they are another model's
    rows = {row["replica"]: row for row in why["scores"]}
    assert rows["r1"]["matched_blocks"] is None and rows["r0"]["matched_blocks"] == 0
    # A revision that changed only the engine's arguments keeps the model: precise for it too.
    store.put(keyspace.revisions("d", 3), Revision(deployment="d", revision=3, template=Template(
        model="m", profile="p", engine_args=["--max-num-seqs", "8"])).model_dump_json())
    src._revisions.clear()
    asked.clear()
    _, why = asyncio.run(ReplicaRouter(kv=src).apick(view, CHAT, 0.0))
    assert asked == [["r0", "r2"]] and why["kv_other_model"] == ["r1"]
    store.close()


def test_a_replica_with_another_block_size_is_scored_approximately(tmp_path):
    store = _store(tmp_path)
    view = _view(3)
    sub = Sub(dict.fromkeys(("r0", "r1", "r2"), "live"), dict.fromkeys(("r0", "r1", "r2"), 2),
              {"r0": 16, "r1": 32, "r2": 16})  # r1's revision runs --block-size 32
    client, _ = _agent(sub, {}, simulated=True)
    src = AgentKvSource(UpstreamCache(store, ttl_secs=0), client, None, timeout_s=5)
    router = ReplicaRouter(kv=src)
    _, why = asyncio.run(router.apick(view, CHAT, 0.0))
    assert why["kv_states"] == {"r0": "live", "r1": "other_block_size", "r2": "live"}
    assert why["blind_replicas"] == ["r1"] and why["kv_blind"] == []
    assert asyncio.run(src.hasher(view)).hasher.block_size == 16  # the size most replicas report
    sub.sizes = dict.fromkeys(("r0", "r1", "r2"), 128)  # e.g. the CPU build: none matches the default
    _, why = asyncio.run(router.apick(view, CHAT, 0.0))
    assert set(why["kv_states"].values()) == {"other_block_size"}
    assert asyncio.run(src.hasher(view)).hasher.block_size == 128  # learned from that answer
    _, why = asyncio.run(router.apick(view, CHAT, 0.0))
    assert set(why["kv_states"].values()) == {"live"}
    store.close()


def test_a_tokenizer_answer_over_the_cap_is_refused(tmp_path, monkeypatch):
    """The attack (issue 50, Low): a node answers the tokenizer fetch with an unbounded body."""
    import gateway.kv_source as ks

    store = _store(tmp_path)
    chunk = b" " * (64 << 10)

    async def flood(scope, receive, send):  # a valid answer behind 4 MiB of whitespace, in chunks
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        for _ in range(64):
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b'{"engine": "sim", "files": {}}'})

    monkeypatch.setattr(ks, "MAX_TOKENIZER_ANSWER", 1 << 20)
    src = AgentKvSource(UpstreamCache(store, ttl_secs=0), httpx.AsyncClient(transport=httpx.ASGITransport(app=flood)), None, timeout_s=5)
    assert asyncio.run(src.hasher(_view())) is None
    monkeypatch.setattr(ks, "MAX_TOKENIZER_ANSWER", 8 << 20)  # the same answer under the cap is used
    src = AgentKvSource(UpstreamCache(store, ttl_secs=0), httpx.AsyncClient(transport=httpx.ASGITransport(app=flood)), None, timeout_s=5)
    assert isinstance(asyncio.run(src.hasher(_view())), RequestHasher)
    store.close()
