"""The reconcile pass computes what the nodes hold once per pass, not once per deployment: the
committed CPU and memory over every replica and the free-capacity index are built once, and the
plans of later deployments see the replicas planned before them (Snapshot.capacity and hold)."""

from __future__ import annotations

import asyncio
import json
import time

from common import keyspace
from common.schemas import InferenceDeployment
from common.store.sqlite_store import SqliteStore
from controlplane import orchestration_state
from controlplane.reconcile import plan as rp
from controlplane.reconcile.apply import ReconcileWorker
from tests.controlplane.planner_data import model, node, profile
from tests.controlplane.reconcile.test_reconcile_concurrency import Agent
from tests.support.fake_agents import FakeAgents


def counted_pass(tmp_path, deployments: int, monkeypatch) -> list[dict[str, int]]:
    """Per pass (two of them): how often the committed resources were computed over the
    replicas and how many placement indexes were built, with ``deployments`` of one replica each."""
    store = SqliteStore(tmp_path / f"{deployments}.db")
    store.put(keyspace.models("qwen"), model().model_dump_json())
    store.put(keyspace.profiles("p24"), profile().model_dump_json())
    for n in ("n1", "n2"):
        store.put(keyspace.nodes(n), node(n, 4).model_copy(update={
            "last_heartbeat": time.time() + 600, "address": "https://127.0.0.1:7443"}).model_dump_json())
    for i in range(deployments):
        store.put(keyspace.deployments(f"d{i}"), InferenceDeployment(name=f"d{i}", model="qwen", profile="p24",
                                                                     replicas=1).model_dump_json())
    calls = {"committed": 0, "index": 0}
    committed, index = orchestration_state.committed_resources, orchestration_state.PlacementIndex

    def counting_committed(*args, **kwargs):
        calls["committed"] += 1
        return committed(*args, **kwargs)

    def counting_index(*args, **kwargs):
        calls["index"] += 1
        return index(*args, **kwargs)

    monkeypatch.setattr(orchestration_state, "committed_resources", counting_committed)
    monkeypatch.setattr(orchestration_state, "PlacementIndex", counting_index)
    agents = FakeAgents(Agent, active=set(), inside=set(), peak=0, overlap=False, done=[], deleted=[],
                        release=asyncio.Event())
    agents.release.set()
    out = []

    async def run():
        worker = ReconcileWorker(store, agents, rp.ReconcileSettings())
        try:
            for _ in range(2):
                before = dict(calls)
                await worker.tick()
                out.append({k: v - before[k] for k, v in calls.items()})
        finally:
            await worker.aclose()

    try:
        asyncio.run(run())
        owners = [json.loads(kv.value)["replica_id"] for kv in store.list(keyspace.gpu_reservations())]
        assert len(owners) == len(set(owners)) == deployments  # each placed once, no GPU shared
    finally:
        store.close()
    return out


def test_what_the_nodes_hold_is_computed_once_per_pass_whatever_the_deployments(tmp_path, monkeypatch):
    few, many = counted_pass(tmp_path, 2, monkeypatch), counted_pass(tmp_path, 7, monkeypatch)
    # the first pass places every deployment's replica: one computation and one index for all
    assert few[0] == many[0] == {"committed": 1, "index": 1}
    # the second has nothing to place: the committed resources once, no index
    assert few[1] == many[1] == {"committed": 1, "index": 0}
