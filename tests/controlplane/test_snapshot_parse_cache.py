"""load_snapshot with a loop's ParseCache (the reconcile pass keeps one): a replica or observation
unchanged since the last pass is not validated again (the same object comes back), a changed one
is read anew, a deleted one leaves the cache; and Snapshot.agent_observed indexes the nodes'
lists once per pass, with the same answer as the pure function. Real SQLite store."""

from __future__ import annotations

from common import keyspace
from common.engine_metrics.reported import agent_observed, observed_by_node
from common.schemas import ReplicaObservation
from common.store.sqlite_store import SqliteStore
from controlplane.orchestration_state import ParseCache, load_snapshot
from tests.controlplane.planner_data import NOW, node, replica


def _store(tmp_path):
    store = SqliteStore(tmp_path / "f.db")
    store.put(keyspace.nodes("n1"), node("n1", 4).model_copy(update={"observed_replicas": ["qwen-0-abc"]})
              .model_dump_json())
    for i in range(3):
        r = replica(i, "n1")
        store.put(keyspace.replicas(r.deployment, r.replica_id), r.model_dump_json())
        store.put(keyspace.observations(r.replica_id), ReplicaObservation(
            replica_id=r.replica_id, scraped_at=NOW, ok=True).model_dump_json())
    return store


def test_unchanged_records_come_from_the_cache_and_changed_or_deleted_ones_do_not(tmp_path):
    store = _store(tmp_path)
    cache = ParseCache()
    first = load_snapshot(store, cache)
    r0, r1 = first.replicas["qwen"][0], first.replicas["qwen"][1]
    store.put(keyspace.observations("qwen-1-abc"), ReplicaObservation(
        replica_id="qwen-1-abc", scraped_at=NOW + 5, ok=True, queue_depth=4).model_dump_json())
    store.delete(keyspace.replicas("qwen", "qwen-2-abc"))
    second = load_snapshot(store, cache)
    assert second.replicas["qwen"][0] is r0 and second.replicas["qwen"][1] is r1  # not validated again
    assert second.observations["qwen-0-abc"] is first.observations["qwen-0-abc"]
    assert second.observations["qwen-1-abc"].queue_depth == 4  # the changed one, read anew
    assert [r.replica_id for r in second.replicas["qwen"]] == ["qwen-0-abc", "qwen-1-abc"]
    assert keyspace.replicas("qwen", "qwen-2-abc") not in cache._seen  # a deleted record leaves the cache
    # without a cache every load validates afresh
    assert load_snapshot(store).replicas["qwen"][0] is not r0
    store.close()


def test_agent_observed_is_the_pure_answer_indexed_once_per_pass(tmp_path):
    store = _store(tmp_path)
    snap = load_snapshot(store)
    reps = snap.replicas["qwen"]
    assert snap.agent_observed(reps) == agent_observed(observed_by_node(snap.nodes), reps) == {"qwen-0-abc"}
    index = snap._observed
    assert snap.agent_observed(reps[1:]) == set() and snap._observed is index  # built once
    store.close()
