"""The door's parse policy (common.records.reading): a get of a record that does not parse raises
UnreadableRecord naming the kind and the key; a list skips it and counts it by kind on /metrics."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from common import keyspace
from common.errors import UnreadableRecord
from common.records import deployments, identity_mappings, plans, reading, replicas, rollouts, tenant_limits
from common.schemas import InferenceDeployment


def _skipped(kind: str) -> float:
    return reading.UNREADABLE.labels(kind)._value.get()


def test_a_get_names_the_kind_and_the_key_a_list_skips_and_counts(store):
    deployments.create(store, InferenceDeployment(name="ok", model="qwen", profile="small"))
    store.put(keyspace.deployments("bad"), '{"name": "bad", "replicas": "many"}')
    store.put(keyspace.deployments("cut"), '{"name": "cut", "mod')
    before = _skipped("deployment")

    with pytest.raises(UnreadableRecord) as err:
        deployments.get(store, "bad")
    assert "deployment" in err.value.message and keyspace.deployments("bad") in err.value.message
    assert err.value.status == 500 and err.value.code == "unreadable_record"
    with pytest.raises(UnreadableRecord, match="not JSON"):
        deployments.stored(store, "cut")
    with pytest.raises(UnreadableRecord):  # the read-modify-write loop reads the same way
        deployments.update(store, "bad", lambda d: d)

    assert [d.name for d in deployments.list(store)] == ["ok"]
    assert _skipped("deployment") == before + 2
    assert [name for name, _ in deployments.stored_items(store)] == ["bad", "ok"]  # "bad" is JSON
    assert _skipped("deployment") == before + 3


@pytest.mark.parametrize(("kind", "key", "get", "listing"), [
    ("replica", keyspace.replicas("d", "r1"), lambda s: replicas.get(s, "d", "r1"), replicas.list),
    ("tenant limits", keyspace.tenant_limits("t"), lambda s: tenant_limits.get(s, "t"), tenant_limits.list),
    ("identity mapping", keyspace.identity_mappings("m"), lambda s: identity_mappings.get(s, "m"),
     identity_mappings.list),
    ("routing plan", keyspace.routing_plans("e"), lambda s: plans.get(s, "e"), plans.list),
    ("rollout", keyspace.rollouts("d", 1), lambda s: rollouts.get_rollout(s, "d", 1),
     lambda s: rollouts.list_rollouts(s, "d")),
])
def test_every_typed_reader_follows_the_policy(store, kind, key, get, listing):
    store.put(key, "[1, 2]")
    before = _skipped(kind)
    with pytest.raises(UnreadableRecord, match=kind):
        get(store)
    assert listing(store) == []
    assert _skipped(kind) == before + 1


def test_the_counter_is_on_an_apps_registry_once():
    registry = CollectorRegistry()
    reading.install(registry)
    reading.install(registry)  # an app built twice on one state keeps one
    reading.skipped("quota", "/fabric/quotas/x")
    text = generate_latest(registry).decode()
    assert 'fabric_records_unreadable_total{kind="quota"}' in text
    assert "/fabric/quotas/x" not in text  # the key is logged, never a label
