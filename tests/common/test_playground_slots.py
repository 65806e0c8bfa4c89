"""Playground-key slots (common.records.playground_slots) on a real SQLite store: a slot freed or
given back takes its lease with it, so a loop of creates and revokes holds no lease beyond the
slots still taken."""

from __future__ import annotations

from common.records import playground_slots
from common.store.sqlite_store import SqliteStore


def test_a_freed_or_given_back_slot_leaves_no_lease(tmp_path):
    store = SqliteStore(tmp_path / "f.db")
    try:
        taken = [playground_slots.take(store, "ep", "alice", 2, 900) for _ in range(3)]
        assert taken[2] is None  # two slots, both held
        first, second = taken[0], taken[1]
        assert first is not None and second is not None
        playground_slots.hold(store, first, "key-1")
        playground_slots.free(store, "ep", {"key-1"}, "alice")
        assert not store.refresh_lease(first.lease)  # revoked with its slot
        playground_slots.give_back(store, second)
        assert not store.refresh_lease(second.lease)
        assert store.list(playground_slots._prefix("ep", "alice")) == []
        again = playground_slots.take(store, "ep", "alice", 2, 900)
        assert again is not None and store.refresh_lease(again.lease)
    finally:
        store.close()
