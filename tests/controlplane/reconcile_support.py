"""Scaffolding the reconcile tests share: a store seeded with one model, profile, node and
deployment (the agent pool is tests.support.fake_agents.FakeAgents)."""

from __future__ import annotations

import time

from common import keyspace
from common.store.sqlite_store import SqliteStore
from tests.controlplane.planner_data import deployment, model, node, profile


def seeded_store(tmp_path, **node_update) -> SqliteStore:
    """Model and profile qwen/p24, node n1 (two GPUs, heartbeat in the future, `node_update` on
    top) and deployment qwen with one replica."""
    s = SqliteStore(tmp_path / "fabric.db")
    s.put(keyspace.models("qwen"), model().model_dump_json())
    s.put(keyspace.profiles("p24"), profile().model_dump_json())
    s.put(keyspace.nodes("n1"), node("n1", 2).model_copy(update={"last_heartbeat": time.time() + 600,
                                                                 **node_update}).model_dump_json())
    s.put(keyspace.deployments("qwen"), deployment(1).model_dump_json())
    return s
