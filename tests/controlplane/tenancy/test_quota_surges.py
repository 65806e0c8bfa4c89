"""A tenant's use counts the surge of its own active rollouts only: the check of one tenant's
create or scale reads the target revision of that tenant's rollouts, never every tenant's
(controlplane.tenancy.quotas.tenant_usage, on a real SQLite store)."""

from __future__ import annotations

import json

from common import keyspace
from common.records import rollouts as rollout_records
from common.rollouts import Rollout
from common.schemas import Template
from common.store.sqlite_store import SqliteStore
from controlplane.tenancy import quotas


class Gets:
    """A store that notes every key read with get."""

    def __init__(self, inner):
        self.inner = inner
        self.got: list[str] = []

    def get(self, key):
        self.got.append(key)
        return self.inner.get(key)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def deployment_with_rollout(store, name: str, tenant: str, strategy: str) -> None:
    store.put(keyspace.deployments(name), json.dumps({"name": name, "tenant": tenant, "profile": "p", "replicas": 2,
                                                      "model": "m"}))
    rollout_records.write_revision(store, name, Template(model="m", profile="p"), who="t", reason="", now=1.0)
    rollout_records.write_revision(store, name, Template(model="m", profile="p2"), who="t", reason="", now=2.0)
    assert rollout_records.create_rollout(store, Rollout(id=1, deployment=name, strategy=strategy, from_revision=1,
                                                         to_revision=2, replicas=2, max_surge=1))


def test_a_tenants_use_reads_only_its_own_rollouts_revisions(tmp_path):
    inner = SqliteStore(tmp_path / "f.db")
    try:
        profile = {"gpu": {"count": 1}, "cpu": 4, "memory_gib": 8.0}
        inner.put(keyspace.profiles("p"), json.dumps({"name": "p", **profile}))
        inner.put(keyspace.profiles("p2"), json.dumps({"name": "p2", **profile, "cpu": 8}))
        deployment_with_rollout(inner, "a1", "a", "rolling")  # 2 replicas + 1 surge at p2
        for i in range(3):
            deployment_with_rollout(inner, f"b{i}", "b", "blue-green")
        store = Gets(inner)

        used = quotas.tenant_usage(store, "a")

        assert (used.gpus, used.cpu, used.memory_gib) == (3, 2 * 4 + 8, 24.0)
        assert [k for k in store.got if k.startswith(keyspace.revisions())] == [keyspace.revisions("a1", 2)]
        # Scaling a1 leaves its own replicas out but keeps its rollout's surge.
        scaled = quotas.tenant_usage(store, "a", exclude="a1")
        assert (scaled.gpus, scaled.cpu) == (1, 8)
        # The cluster-wide list still counts every tenant's surge.
        assert set(quotas.rollout_surges(inner, quotas.per_replica(inner))) == {"a1", "b0", "b1", "b2"}
    finally:
        inner.close()
