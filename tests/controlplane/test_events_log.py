"""The event log on both stores (SQLite and a real etcd): bounded by count and by age, filtered
by object, kind and since, chronological."""

from __future__ import annotations

import pytest

from common import keyspace
from common.records.events import EventSink, recent_events, record_event, trim
from common.store.sqlite_store import SqliteStore
from controlplane.api.events import parse_since
from lab.rigs.etcd_server import etcd_server  # noqa: F401  (a fixture, used by name)

T0 = 1_800_000_000.0


@pytest.fixture(params=["sqlite", "etcd"])
def store(request, tmp_path):
    if request.param == "sqlite":
        s = SqliteStore(tmp_path / "fabric.db")
    else:
        server = request.getfixturevalue("etcd_server")
        s = server.open("fabricd")
        for kv in s.list(keyspace.events()):  # the etcd server is shared by the session
            s.delete(kv.key)
    yield s
    s.close()


def test_bounded_by_count(store):
    for i in range(12):
        record_event(store, "replica", f"r{i}", "ReplicaReady", "ok", keep=5, now=T0 + i)
    names = [e.name for e in recent_events(store, 100)]
    assert names == ["r7", "r8", "r9", "r10", "r11"]


def test_bounded_by_age(store):
    for i in range(4):
        record_event(store, "node", "n1", "AgentError", f"try {i}", keep=100, max_age_s=3600, now=T0 + i * 1000)
    # The fourth write (at T0+3000) keeps everything younger than an hour: all four.
    assert len(recent_events(store, 100)) == 4
    record_event(store, "node", "n1", "AgentError", "later", keep=100, max_age_s=3600, now=T0 + 5000)
    assert [e.message for e in recent_events(store, 100)] == ["try 2", "try 3", "later"]
    assert trim(store, 100, 3600, now=T0 + 10_000) == 3
    assert recent_events(store, 100) == []


def test_filters_by_object_kind_and_since(store):
    sink = EventSink(store)
    sink("replica", "d-0-aa", "ProbeFailed", "health failed (1): HTTP 500", warning=True, now=T0)
    sink("deployment", "d", "ScaledOut", "scale out to 2", now=T0 + 1)
    sink("replica", "d-1-bb", "ReplicaReady", "health answers", now=T0 + 2)
    by_object = recent_events(store, obj="replica/d-0-aa")
    assert [(e.reason, e.type, e.object) for e in by_object] == [("ProbeFailed", "Warning", "replica/d-0-aa")]
    assert [e.name for e in recent_events(store, obj="d")] == ["d"]
    assert [e.name for e in recent_events(store, kind="replica")] == ["d-0-aa", "d-1-bb"]
    assert [e.name for e in recent_events(store, since=T0 + 0.5)] == ["d", "d-1-bb"]
    assert recent_events(store, since=T0 + 2) == []


def test_since_parses_ages_and_times():
    assert parse_since("90s", 1000.0) == 910.0
    assert parse_since("10m", 1000.0) == 400.0
    assert parse_since("1764500000.5", 0) == 1764500000.5
    assert parse_since(None, 0) is None
    for bad in ("yesterday", "-5", "nan", "5x"):
        with pytest.raises(Exception, match="since"):
            parse_since(bad, 0)


def test_a_loops_sink_trims_once_per_twentieth_of_keep_not_per_write(store):
    """A trim lists the whole log: a loop writing many events a pass (routing: one per endpoint
    whose weights moved) trims after keep // 20 of its writes, and the log stays within keep
    plus that many."""
    from lab.rigs.scale import CountingStore

    counting = CountingStore(store)
    sink = EventSink(counting, keep=100)
    for i in range(200):
        sink("endpoint", f"e{i}", "WeightsChanged", "moved", now=T0 + i * 0.1)  # 20 s of writes
    assert counting.calls.get("list", 0) == 200 // sink.trim_every == 40  # per write it was 200
    assert 100 <= len(recent_events(store, 1000)) <= 100 + sink.trim_every
    # A trim deletes its surplus in one range delete: one write per trim past keep (writes
    # 105, 110, ..., 200), not one per event.
    assert counting.written["events"] == 200 + (200 - 100) // sink.trim_every
    sink("endpoint", "late", "WeightsChanged", "moved", now=T0 + 100)  # a minute after its last trim
    assert counting.calls.get("list", 0) == 41
