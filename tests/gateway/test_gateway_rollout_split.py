"""The gateway's direct replica choice follows a rollout's share (weighted rendezvous hashing)."""

from __future__ import annotations

import pytest

from common.rollouts import Rollout
from common.schemas import EndpointStatus, InferenceEndpoint, Replica
from gateway.upstreams import EndpointView, order_targets, rollout_weights


def view(share: int | None, n_old: int = 4, n_new: int = 1, phase: str = "Progressing") -> EndpointView:
    ep = InferenceEndpoint(name="e", deployment="d", status=EndpointStatus(vip=None))
    reps = tuple(Replica(replica_id=f"old-{i}", deployment="d", ordinal=i, revision=1, node="n",
                         host=f"10.0.1.{i + 1}", ready=True) for i in range(n_old))
    reps += tuple(Replica(replica_id=f"new-{i}", deployment="d", ordinal=10 + i, revision=2, node="n",
                          host=f"10.0.2.{i + 1}", ready=True) for i in range(n_new))
    rec = Rollout(id=1, deployment="d", strategy="canary", from_revision=1, to_revision=2, replicas=n_old,
                  share=share, phase=phase)
    return EndpointView(ep, reps, {}, rollout_weights(reps, rec))


def new_share(v: EndpointView, sessions: int = 4000) -> float:
    firsts = [order_targets(v, f"session-{i}")[0] for i in range(sessions)]
    return sum(1 for f in firsts if "10.0.2." in f) / sessions


@pytest.mark.parametrize("share,n_new", [(5, 1), (20, 1), (50, 2), (20, 2)])
def test_sessions_follow_the_share(share, n_new):
    assert new_share(view(share, n_new=n_new)) == pytest.approx(share / 100, abs=0.025)


def test_weight_zero_is_never_first_but_stays_a_retry():
    v = view(0)
    assert new_share(v, 500) == 0
    assert any("10.0.2." in t for t in order_targets(v, "s"))  # still the last resort


def test_no_split_without_an_active_shared_rollout():
    assert view(None).weights == {} and view(20, phase="Succeeded").weights == {}
    assert view(20, n_new=0).weights == {}  # one set alone: equal weights


def test_a_session_keeps_its_replica_while_the_share_holds():
    v = view(20)
    assert order_targets(v, "abc") == order_targets(v, "abc")


def test_read_view_takes_the_share_from_the_stored_record(tmp_path):
    from common import keyspace
    from common.store.sqlite_store import SqliteStore
    from gateway.upstreams import read_view

    store = SqliteStore(tmp_path / "s.db")
    v = view(20)
    store.put(keyspace.endpoints("e"), v.endpoint.model_dump_json())
    for r in v.replicas:
        store.put(keyspace.replicas("d", r.replica_id), r.model_dump_json())
    old = Rollout(id=1, deployment="d", strategy="canary", from_revision=1, to_revision=2, replicas=4, share=50,
                  phase="RolledBack")
    store.put(keyspace.rollouts("d", 1), old.model_dump_json())
    assert read_view(store, "e").weights == {}  # a finished rollout splits nothing
    store.put(keyspace.rollouts("d", 2), old.model_copy(update={"id": 2, "share": 20, "phase": "Progressing"})
              .model_dump_json())
    got = read_view(store, "e").weights
    assert got["new-0"] == 20 and got["old-0"] == 20 and sum(got.values()) == 100
    store.close()
