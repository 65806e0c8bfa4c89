"""The gateway's direct replica choice follows a rollout's share (weighted rendezvous hashing)."""

from __future__ import annotations

import time

import pytest

from common.rollouts import Rollout
from common.schemas import EndpointStatus, InferenceEndpoint, Node, Replica, ReplicaObservation
from gateway.upstreams import EndpointView, order_targets, read_view
from lab.rigs.routing_plans import publish_plans


def view(share: int | None, n_old: int = 4, n_new: int = 1, phase: str = "Progressing", tmp_path=None) -> EndpointView:
    """The view the gateway reads once the routing planner published the endpoint's plan."""
    from common import keyspace
    from common.store.sqlite_store import SqliteStore

    store = SqliteStore(tmp_path / f"s-{share}-{n_old}-{n_new}-{phase}.db")
    ep = InferenceEndpoint(name="e", deployment="d", status=EndpointStatus(vip=None))
    reps = [Replica(replica_id=f"old-{i}", deployment="d", ordinal=i, revision=1, node="n", phase="Ready",
                    host=f"10.0.1.{i + 1}", ready=True) for i in range(n_old)]
    reps += [Replica(replica_id=f"new-{i}", deployment="d", ordinal=10 + i, revision=2, node="n", phase="Ready",
                     host=f"10.0.2.{i + 1}", ready=True) for i in range(n_new)]
    store.put(keyspace.endpoints("e"), ep.model_dump_json())
    store.put(keyspace.nodes("n"), Node(id="n", address="https://127.0.0.1:1", last_heartbeat=time.time())
              .model_dump_json())
    for r in reps:
        store.put(keyspace.replicas("d", r.replica_id), r.model_dump_json())
        store.put(keyspace.observations(r.replica_id), ReplicaObservation(
            replica_id=r.replica_id, scraped_at=time.time(), ok=True).model_dump_json())
    rec = Rollout(id=1, deployment="d", strategy="canary", from_revision=1, to_revision=2, replicas=n_old,
                  share=share, phase=phase)
    store.put(keyspace.rollouts("d", 1), rec.model_dump_json())
    publish_plans(store)
    got = read_view(store, "e")
    store.close()
    return got


def new_share(v: EndpointView, sessions: int = 4000) -> float:
    firsts = [order_targets(v, f"session-{i}")[0] for i in range(sessions)]
    return sum(1 for f in firsts if "10.0.2." in f) / sessions


@pytest.mark.parametrize("share,n_new", [(5, 1), (20, 1), (50, 2), (20, 2)])
def test_sessions_follow_the_share(share, n_new, tmp_path):
    assert new_share(view(share, n_new=n_new, tmp_path=tmp_path)) == pytest.approx(share / 100, abs=0.025)


def test_weight_zero_is_never_first_but_stays_a_retry(tmp_path):
    v = view(0, tmp_path=tmp_path)
    assert new_share(v, 500) == 0
    assert any("10.0.2." in t for t in order_targets(v, "s"))  # still the last resort


def test_no_split_without_an_active_shared_rollout(tmp_path):
    assert view(None, tmp_path=tmp_path).weights == {}
    assert view(20, phase="Succeeded", tmp_path=tmp_path).weights == {}
    assert view(20, n_new=0, tmp_path=tmp_path).weights == {}  # one set alone: equal weights


def test_a_session_keeps_its_replica_while_the_share_holds(tmp_path):
    v = view(20, tmp_path=tmp_path)
    assert order_targets(v, "abc") == order_targets(v, "abc")


def test_the_gateway_takes_the_weights_the_agents_get(tmp_path):
    """The view's weights are the published plan's: the same split the Maglev table realises."""
    from common import keyspace
    from common.records import plans
    from common.store.sqlite_store import SqliteStore

    v = view(20, tmp_path=tmp_path)
    store = SqliteStore(tmp_path / "s-20-4-1-Progressing.db")
    plan = plans.get(store, "e")
    assert plan.split is not None and plan.split.percent == 20
    assert v.weights == {rid: float(w) for rid, w in plan.routed().items()}
    # a replica that went draining since the plan leaves the gateway at once; a new one waits for the plan
    old0 = Replica.model_validate_json(store.get(keyspace.replicas("d", "old-0")).value)
    store.put(keyspace.replicas("d", "old-0"), old0.model_copy(update={"draining": True}).model_dump_json())
    store.put(keyspace.replicas("d", "new-9"), Replica(replica_id="new-9", deployment="d", ordinal=19, revision=2,
                                                       node="n", phase="Ready", host="10.0.2.9", ready=True)
              .model_dump_json())
    store.put(keyspace.observations("new-9"), ReplicaObservation(replica_id="new-9", scraped_at=time.time(), ok=True)
              .model_dump_json())
    ids = {r.replica_id for r in read_view(store, "e").replicas}
    assert "old-0" not in ids and "new-9" not in ids
    publish_plans(store)  # the next routing tick
    assert "new-9" in {r.replica_id for r in read_view(store, "e").replicas}
    store.close()
