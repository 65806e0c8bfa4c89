"""common.store.mirror: listed once, then only the changes, on SQLite and a real etcd alike."""

from __future__ import annotations

from common.errors import Conflict
from common.store.locks import FencedStore
from common.store.mirror import Mirror
from lab.rigs.scale import CountingStore


def test_lists_once_then_applies_only_changes(store, ns):
    store.put_all([(ns + f"r/d1/{i}", f"v{i}") for i in range(5)] + [(ns + "r/d2/0", "x"), (ns + "e/a", "1")])
    counted = CountingStore(store)
    mirror = Mirror(counted, [ns + "r/", ns + "e/"])
    assert mirror.poll() == 7 and counted.calls.get("list", 0) == 2
    assert [kv.value for kv in mirror.list(ns + "r/d1/")] == [f"v{i}" for i in range(5)]
    assert mirror.poll() == 0  # nothing changed: no list, nothing applied
    store.put(ns + "r/d1/2", "new")
    store.delete(ns + "r/d2/0")
    store.put(ns + "other", "not mirrored")
    assert mirror.poll() == 2 and counted.calls.get("list", 0) == 2
    assert mirror.get(ns + "r/d1/2").value == "new" and mirror.get(ns + "r/d2/0") is None
    assert mirror.get(ns + "r/d1/2").mod_revision == store.get(ns + "r/d1/2").mod_revision
    assert mirror.list(ns + "r/d2/") == [] and mirror.get(ns + "other").value == "not mirrored"  # falls through


def test_moved_names_only_what_a_reader_looked_at(store, ns):
    store.put_all([(ns + "r/d1/0", "a"), (ns + "r/d2/0", "b"), (ns + "o/0", "q")])
    mirror = Mirror(store, [ns + "r/", ns + "o/"])
    mirror.poll()
    view, reads = mirror.tracked()
    assert [kv.value for kv in view.list(ns + "r/d1/")] == ["a"] and view.get(ns + "o/0").value == "q"
    at = mirror.version
    store.put(ns + "r/d2/0", "b2")  # another deployment's replica
    mirror.poll()
    assert not mirror.moved(reads, at)
    store.put(ns + "r/d1/1", "new replica")  # a key appears under a listed prefix
    mirror.poll()
    assert mirror.moved(reads, at)
    at = mirror.version
    store.put(ns + "o/0", "q2")  # a key read by get
    mirror.poll()
    assert mirror.moved(reads, at)


def test_a_gap_in_watch_history_lists_again(store, ns):
    store.put(ns + "k/a", "1")

    class Compacted(CountingStore):
        def watch(self, prefix, after_revision, timeout):
            raise Conflict("history before this revision was compacted", code="compacted")

    mirror = Mirror(store, [ns + "k/"])
    mirror.poll()
    store.delete(ns + "k/a")
    store.put(ns + "k/b", "2")
    gapped = Compacted(store)
    mirror.store = gapped
    assert mirror.poll() == 2 and gapped.calls.get("list", 0) == 1
    assert [kv.key for kv in mirror.list(ns + "k/")] == [ns + "k/b"]


def test_history_that_comes_at_once_is_not_waited_for(store, ns):
    store.put_all([(ns + "r/a", "1"), (ns + "e/a", "1")])
    waits: list[float] = []

    class Timed(CountingStore):
        def watch(self, prefix, after_revision, timeout):
            waits.append(timeout)
            return self.inner.watch(prefix, after_revision, timeout)

    mirror = Mirror(Timed(store), [ns + "r/", ns + "e/"])
    mirror.poll()
    store.put(ns + "r/a", "2")
    store.put(ns + "r/b", "3")
    assert mirror.poll() == 2 and [kv.value for kv in mirror.list(ns + "r/")] == ["2", "3"]
    assert FencedStore(store, lock=None).history_wait_s == store.history_wait_s  # the leader's store says its own
    if store.history_wait_s == 0:  # SQLite: one watch per prefix answers all of it, nothing waited for
        assert waits == [0.0, 0.0]
    else:  # etcd: each prefix is asked, waiting its sync, until an answer is empty
        assert len(waits) >= 3 and set(waits) == {store.history_wait_s}


def test_deleted_keys_change_records_are_bounded_and_still_move_their_readers(store, ns, monkeypatch):
    """A fleet that churns (keys made and deleted) keeps the copy's change records in proportion
    to its live keys; a reader of a key whose record was dropped still sees it moved, once."""
    from common.store import mirror as mirror_mod

    monkeypatch.setattr(mirror_mod, "FORGET_SLACK", 4)
    store.put_all([(ns + "r/keep/0", "k"), (ns + "r/gone/0", "g")])
    mirror = Mirror(store, [ns + "r/"])
    mirror.poll()
    view, reads = mirror.tracked()
    assert view.get(ns + "r/gone/0").value == "g" and view.list(ns + "r/gone/") != []
    at = mirror.version
    store.delete(ns + "r/gone/0")
    for i in range(12):  # replicas made and deleted
        store.put(ns + f"r/churn{i}/0", "x")
        mirror.poll()
        store.delete(ns + f"r/churn{i}/0")
        mirror.poll()
    assert len(mirror._key_version) <= 2 * 1 + 4 + 2 and len(mirror._dir_version) <= 8
    assert mirror.moved(reads, at)  # its key was deleted: read again
    view, reads = mirror.tracked()
    assert view.get(ns + "r/gone/0") is None and view.list(ns + "r/gone/") == []
    at = mirror.version
    store.put(ns + "r/keep/1", "other deployment")
    mirror.poll()
    assert not mirror.moved(reads, at)  # nothing it read changed since
    store.put(ns + "r/gone/0", "back")
    mirror.poll()
    assert mirror.moved(reads, at)
