"""One object for an endpoint's final weights: during a canary, GET /api/ai/explain/routing (and so
the console's bars) shows the published plan the routing controller pushed to the agents, rollout
split and generation included; a draining replica is pushed as a draining weight-0 backend.
Readings that move after the tick change what explain shows only when the next tick publishes;
an endpoint no tick has published yet gets the plan the next tick would publish, marked so."""

import asyncio
import time
from types import SimpleNamespace

import pytest

from common import keyspace
from common.records import plans
from common.records import rollouts as rollout_records
from common.schemas import InferenceEndpoint, ReplicaObservation
from controlplane.api.orchestration import explain_routing
from controlplane.placement import vip_pool
from controlplane.routing.controller import RoutingWorker
from tests.controlplane.planner_data import node
from tests.controlplane.rollouts.rollout_data import record, rep
from tests.controlplane.test_routing_controller import RecordingAgent
from tests.support.fake_agents import FakeAgents


class Rollouts:
    """The RolloutWorker's say in the routing tick: the active records, not advanced here."""

    def __init__(self, active):
        self.active = active

    def advance(self, replicas, observations):
        pass


def test_explain_equals_pushed_during_a_canary_and_draining_stays_in_the_service(store):
    now = time.time()
    store.put(keyspace.nodes("n1"), node("n1", 4).model_copy(update={"last_heartbeat": now}).model_dump_json())
    store.put(keyspace.endpoints("ep"), InferenceEndpoint(name="ep", deployment="qwen",
                                                          routing="least_queue").model_dump_json())
    replicas = [rep(0, 1), rep(1, 1), rep(2, 1, draining=True), rep(0, 2)]
    for r in replicas:
        r = r.model_copy(update={"created_at": now - 100, "ready_since": now - 100})
        store.put(keyspace.replicas("qwen", r.replica_id), r.model_dump_json())
        store.put(keyspace.observations(r.replica_id), ReplicaObservation(
            replica_id=r.replica_id, scraped_at=now, ok=True, queue_depth=r.ordinal % 3).model_dump_json())
    canary = record("canary", replicas=2).model_copy(update={"share": 20})
    assert rollout_records.create_rollout(store, canary)
    agents = FakeAgents(lambda _: RecordingAgent())
    worker = RoutingWorker(store, agents, vip_pool.parse_pool("10.96.0.0/30"), rollouts=Rollouts({"qwen": canary}))
    worker.scrape_all = lambda snap: asyncio.sleep(0)  # observations are seeded

    async def run():
        await worker.tick()
        await worker.aclose()

    asyncio.run(run())
    (pushed,) = agents.by_node["n1"].services.values()
    (spec,) = agents.by_node["n1"].specs.values()
    explained = explain_routing("ep", SimpleNamespace(store=store))
    assert {b["backend"]: b["weight"] for b in explained["backends"]} == pushed
    assert explained["published"] and explained["generation"] == spec.generation == plans.get(store, "ep").generation
    assert explained["split"]["percent"] == 20
    by_id = {r["replica_id"]: r for r in explained["replicas"]}
    new, olds = by_id["r2-0"]["weight"], by_id["r1-0"]["weight"] + by_id["r1-1"]["weight"]
    assert new / (new + olds) == pytest.approx(0.2, abs=0.05)  # the split, not the strategy alone
    assert "rollout" in by_id["r2-0"]["reason"]
    assert pushed["10.0.1.3:8000"] == 0  # the draining replica keeps its flows at weight 0
    assert [b["backend"] for b in explained["backends"] if b["draining"]] == ["10.0.1.3:8000"]

    # A reading that would move the weights, with no tick since: explain still shows what the
    # agents hold (the published plan), not a recomputation they never got.
    store.put(keyspace.observations("r1-0"), ReplicaObservation(replica_id="r1-0", scraped_at=time.time(), ok=False,
                                                               error="scrape failed").model_dump_json())
    again = explain_routing("ep", SimpleNamespace(store=store))
    assert again["generation"] == spec.generation and again["replicas"] == [
        {**r, "metrics": again["replicas"][i]["metrics"]} for i, r in enumerate(explained["replicas"])]
    assert again["replicas"][[r["replica_id"] for r in again["replicas"]].index("r1-0")]["metrics"]["ok"] is False


def test_explain_before_any_tick_says_the_plan_is_not_published_yet(store):
    now = time.time()
    store.put(keyspace.nodes("n1"), node("n1", 4).model_copy(update={"last_heartbeat": now}).model_dump_json())
    store.put(keyspace.endpoints("ep"), InferenceEndpoint(name="ep", deployment="qwen").model_dump_json())
    r = rep(0, 1).model_copy(update={"created_at": now - 100, "ready_since": now - 100})
    store.put(keyspace.replicas("qwen", r.replica_id), r.model_dump_json())
    store.put(keyspace.observations(r.replica_id), ReplicaObservation(
        replica_id=r.replica_id, scraped_at=now, ok=True).model_dump_json())
    explained = explain_routing("ep", SimpleNamespace(store=store))
    assert not explained["published"] and explained["generation"] is None
    assert [(e["replica_id"], e["included"]) for e in explained["replicas"]] == [("r1-0", True)]
    assert plans.get(store, "ep") is None  # explain computes; it never publishes
    # a plan published for an earlier endpoint of that name on another deployment is not this one's
    plans.publish(store, plans.PublishedPlan(endpoint="ep", deployment="old", generation=7, strategy="round_robin"))
    assert explain_routing("ep", SimpleNamespace(store=store))["generation"] is None
