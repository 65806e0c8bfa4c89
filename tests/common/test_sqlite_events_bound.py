"""The SQLite store's watch history is bounded by bytes as well as by revisions: a run of large
values keeps at most EVENTS_MAX_BYTES of copies (plus one prune interval), and a watch from a
pruned revision is told so (compacted), as etcd does."""

from __future__ import annotations

import sqlite3

import pytest

from common.errors import Conflict
from common.store import sqlite_store
from common.store.sqlite_store import SqliteStore


def test_large_values_do_not_pile_up_in_the_watch_history(tmp_path, monkeypatch):
    monkeypatch.setattr(sqlite_store, "EVENTS_MAX_BYTES", 100_000)
    monkeypatch.setattr(sqlite_store, "PRUNE_EVERY", 10)
    store = SqliteStore(tmp_path / "fabric.db")
    value = "v" * 10_000
    for i in range(200):
        store.put(f"/big/{i % 7}", value)
    db = sqlite3.connect(tmp_path / "fabric.db")
    copied = db.execute("SELECT SUM(LENGTH(value)) FROM events").fetchone()[0]
    assert copied <= 100_000 + 10 * 10_000, copied  # the budget plus at most one prune interval
    with pytest.raises(Conflict) as exc:
        store.watch("/big/", 1, timeout=0)
    assert exc.value.code == "compacted"
    assert store.get("/big/3").value == value  # the keys themselves are untouched
    assert len(store.watch("/big/", store.revision() - 3, timeout=0)) == 3
