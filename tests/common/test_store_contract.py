"""The Store contract (common/store/base.py), run against SQLite and a real etcd alike."""

from __future__ import annotations

import threading
import time

import pytest

from common.errors import Conflict, NotFound, TransientError
from common.store import open_store
from common.store.base import MAX_TXN_OPS, Changes
from common.store.etcd_store import EtcdStore
from common.store.sqlite_store import SqliteStore, prefix_end
from lab.rigs.etcd_server import free_port
from lab.rigs.polling import wait_for


def test_get_put_revisions(store, ns):
    key = ns + "a"
    assert store.get(key) is None
    before = store.revision()
    rev1 = store.put(key, "one")
    assert rev1 > before
    assert store.revision() == rev1
    kv = store.get(key)
    assert (kv.key, kv.value, kv.mod_revision, kv.create_revision, kv.lease) == (key, "one", rev1, rev1, None)

    rev2 = store.put(key, "two")
    assert rev2 > rev1
    kv = store.get(key)
    assert (kv.value, kv.mod_revision, kv.create_revision) == ("two", rev2, rev1)


def test_get_all_answers_each_key_in_order_with_none_where_absent(store, ns):
    keys = [ns + f"g/{i:04d}" for i in range(MAX_TXN_OPS * 2 + 3)]  # more than one etcd txn holds
    store.put_all([(k, k[-4:]) for k in keys[::2]])
    asked = [keys[-1], ns + "g/", *keys, ns + "elsewhere"]
    got = store.get_all(asked)
    assert [kv.value if kv else None for kv in got] == [
        keys[-1][-4:], None, *[k[-4:] if i % 2 == 0 else None for i, k in enumerate(keys)], None]
    assert all(kv.key == k and kv == store.get(k) for k, kv in zip(asked, got) if kv is not None)
    assert store.get_all([]) == []


def test_values_and_keys_round_trip_utf8(store, ns):
    key = ns + "naïve/ключ"
    value = '{"msg": "héllo ✓ 中文", "n": 1}'
    store.put(key, value)
    assert store.get(key).value == value
    assert [kv.key for kv in store.list(ns)] == [key]


def test_list_is_sorted_and_bounded_by_prefix(store, ns):
    for key in ["b/2", "a/1", "b/1", "ab", "b/10", "c"]:
        store.put(ns + key, key)
    assert [kv.key for kv in store.list(ns + "b/")] == [ns + "b/1", ns + "b/10", ns + "b/2"]
    # "/a" must not match "/ab": the prefix is literal, not a path component.
    assert [kv.value for kv in store.list(ns + "a")] == ["a/1", "ab"]
    assert [kv.value for kv in store.list(ns + "a/")] == ["a/1"]
    assert store.list(ns + "zzz") == []
    assert len(store.list(ns)) == 6


def test_create_if_absent(store, ns):
    key = ns + "vip/10.0.0.1"
    assert store.create(key, "first") is True
    assert store.create(key, "second") is False
    assert store.get(key).value == "first"
    store.delete(key)
    assert store.create(key, "third") is True
    assert store.get(key).value == "third"


def test_create_all_is_all_or_nothing_at_one_revision(store, ns):
    items = [(ns + f"batch/{i}", f"v{i}") for i in range(3)]
    assert store.create_all(items) is True
    kvs = store.list(ns + "batch/")
    assert [kv.value for kv in kvs] == ["v0", "v1", "v2"] and len({kv.mod_revision for kv in kvs}) == 1
    # One key already there: nothing of the second batch is written.
    assert store.create_all([(ns + "batch/3", "x"), (ns + "batch/1", "y")]) is False
    assert store.get(ns + "batch/3") is None and store.get(ns + "batch/1").value == "v1"
    assert store.create_all([]) is True


def test_put_all_writes_each_batch_at_one_revision(store, ns):
    store.put(ns + "p/0", "old")
    created = store.get(ns + "p/0").create_revision
    rev = store.put_all([(ns + "p/0", "new"), (ns + "p/1", "v1")])
    kvs = store.list(ns + "p/")
    assert [(kv.value, kv.mod_revision) for kv in kvs] == [("new", rev), ("v1", rev)]
    assert kvs[0].create_revision == created and kvs[1].create_revision == rev  # an update keeps its creation
    assert store.put_all([]) == store.revision() == rev
    # More keys than one etcd txn may hold: every one is written, watchers see each put.
    many = [(ns + f"m/{i:04d}", str(i)) for i in range(MAX_TXN_OPS * 2 + 5)]
    last = store.put_all(many)
    assert [(kv.key, kv.value) for kv in store.list(ns + "m/")] == many
    assert last == store.revision()
    events = store.watch(ns + "m/", rev, timeout=1.0)
    assert sorted(e.key for e in events if e.type == "put") == [k for k, _ in many]


def test_cas(store, ns):
    key = ns + "counter"
    assert store.cas(key, "1", 0) is False  # absent key: cas never creates
    assert store.get(key) is None
    store.put(key, "0")
    kv = store.get(key)
    assert store.cas(key, "1", kv.mod_revision) is True
    assert store.cas(key, "2", kv.mod_revision) is False  # stale revision
    after = store.get(key)
    assert after.value == "1"
    assert after.mod_revision > kv.mod_revision
    assert after.create_revision == kv.create_revision


def test_delete_plain_and_at_revision(store, ns):
    key = ns + "d"
    assert store.delete(key) is False
    store.put(key, "x")
    kv = store.get(key)
    store.put(key, "y")
    assert store.delete(key, mod_revision=kv.mod_revision) is False  # stale
    assert store.get(key).value == "y"
    assert store.delete(key, mod_revision=store.get(key).mod_revision) is True
    assert store.get(key) is None
    store.put(key, "z")
    assert store.delete(key) is True
    assert store.delete(key) is False


def test_delete_prefix(store, ns):
    for key in ["gpu/n1/a", "gpu/n1/b", "gpu/n10/a", "gpux"]:
        store.put(ns + key, "v")
    before = store.revision()
    assert store.delete_prefix(ns + "gpu/n1/") == 2
    assert [kv.key for kv in store.list(ns)] == [ns + "gpu/n10/a", ns + "gpux"]
    after = store.revision()
    assert after > before
    assert store.delete_prefix(ns + "gpu/none/") == 0
    assert store.revision() == after  # deleting nothing writes nothing


def test_delete_prefix_below_a_key_deletes_only_the_keys_before_it(store, ns):
    for key in ["ev/001", "ev/002", "ev/003", "ev/004", "ew"]:
        store.put(ns + key, "v")
    before = store.revision()
    assert store.delete_prefix(ns + "ev/", below=ns + "ev/003") == 2
    assert store.revision() == before + 1  # one revision for the range, as etcd's DeleteRange
    assert [kv.key for kv in store.list(ns)] == [ns + "ev/003", ns + "ev/004", ns + "ew"]
    assert store.delete_prefix(ns + "ev/", below=ns + "ev/") == 0
    assert store.delete_prefix(ns + "ev/", below=ns + "ev/003\0") == 1  # up to and with a key
    assert [kv.key for kv in store.list(ns)] == [ns + "ev/004", ns + "ew"]
    with pytest.raises(ValueError, match="not under prefix"):
        store.delete_prefix(ns + "ev/", below=ns + "ew")


def test_write_with_unknown_lease_is_refused(store, ns):
    lease = store.grant_lease(30)
    store.revoke_lease(lease.id)
    with pytest.raises(NotFound):
        store.put(ns + "k", "v", lease=lease.id)
    with pytest.raises(NotFound):
        store.create(ns + "k", "v", lease=lease.id)
    assert store.get(ns + "k") is None


def test_lease_expiry_removes_keys(store, ns):
    lease = store.grant_lease(1)
    assert lease.ttl >= 1  # etcd may raise a TTL to its minimum; the granted one is what counts
    store.put(ns + "hb/n1", "alive", lease=lease.id)
    store.put(ns + "keep", "no lease")
    assert store.get(ns + "hb/n1").lease == lease.id
    start = store.revision()
    wait_for(lambda: store.get(ns + "hb/n1") is None, lease.ttl + 6, "the lease's key to go", interval=0.1)
    assert store.get(ns + "keep").value == "no lease"
    assert store.refresh_lease(lease.id) is False
    events = store.watch(ns, start, 2)
    assert [(e.type, e.key) for e in events] == [("delete", ns + "hb/n1")]


def test_refresh_keeps_keys(store, ns):
    lease = store.grant_lease(1)
    store.put(ns + "leader", "me", lease=lease.id)
    # Refresh well inside the TTL for three TTLs: the key must survive all of it.
    end = time.monotonic() + 3 * lease.ttl
    while time.monotonic() < end:
        assert store.refresh_lease(lease.id) is True
        assert store.get(ns + "leader") is not None
        time.sleep(lease.ttl / 4)
    store.revoke_lease(lease.id)


def test_revoke_deletes_keys_now(store, ns):
    lease = store.grant_lease(60)
    store.put(ns + "r/1", "a", lease=lease.id)
    assert store.create(ns + "r/2", "b", lease=lease.id) is True
    kv = store.get(ns + "r/1")
    assert store.cas(ns + "r/1", "c", kv.mod_revision) is True  # cas without lease detaches it
    store.revoke_lease(lease.id)
    assert [kv.key for kv in store.list(ns + "r/")] == [ns + "r/1"]
    assert store.get(ns + "r/1").lease is None
    store.revoke_lease(lease.id)  # revoking twice is harmless
    assert store.refresh_lease(lease.id) is False


def test_watch_sees_puts_and_deletes_after_revision(store, ns):
    store.put(ns + "w/old", "before")
    start = store.revision()
    rev_put = store.put(ns + "w/a", "1")
    store.put(ns + "other", "ignored")
    store.delete(ns + "w/old")
    events = store.watch(ns + "w/", start, 2)
    # etcd returns the first batch; SQLite may return all pending: either way, in order.
    assert events[0].type == "put" and events[0].key == ns + "w/a" and events[0].value == "1"
    assert events[0].revision == rev_put
    seen = list(events)
    while len(seen) < 2:
        more = store.watch(ns + "w/", seen[-1].revision, 2)
        assert more, "the delete event never arrived"
        seen.extend(more)
    assert [(e.type, e.key, e.value) for e in seen] == [
        ("put", ns + "w/a", "1"),
        ("delete", ns + "w/old", None),
    ]
    assert seen[0].revision < seen[1].revision
    assert all(e.key.startswith(ns + "w/") for e in seen)


def test_watch_times_out_empty(store, ns):
    store.put(ns + "w/x", "1")
    assert store.watch(ns + "w/", store.revision(), 0.3) == []


def test_watch_blocks_until_a_write(store, ns):
    start = store.revision()
    writer = threading.Timer(0.3, lambda: store.put(ns + "late", "v"))
    writer.start()
    try:
        events = store.watch(ns, start, 10)
    finally:
        writer.join()
    assert [(e.type, e.key, e.value) for e in events] == [("put", ns + "late", "v")]


def _follow_into(store, prefix, after, stop, seen):
    """A thread that appends each batch Store.follow yields to ``seen`` until ``stop``."""
    def run():
        for batch in store.follow(prefix, after, stop):
            seen.append(batch)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_follow_streams_every_event_in_order_in_whole_revisions_until_stopped(store, ns):
    store.put(ns + "f/old", "before")
    start = store.revision()
    stop, seen = threading.Event(), []
    thread = _follow_into(store, ns + "f/", start, stop, seen)
    try:
        store.put(ns + "f/a", "1")
        store.put(ns + "other", "ignored")
        txn = store.put_all([(ns + f"f/t{i}", str(i)) for i in range(5)])
        store.delete(ns + "f/old")
        wait_for(lambda: sum(len(b) for b in seen) >= 7, 10, what="the followed events")
        time.sleep(0.3)  # a stream brings nothing else
        events = [e for batch in seen for e in batch]
        assert [(e.type, e.key, e.value) for e in events] == [
            ("put", ns + "f/a", "1"), *(("put", ns + f"f/t{i}", str(i)) for i in range(5)),
            ("delete", ns + "f/old", None)]
        assert [e.revision for e in events] == sorted(e.revision for e in events)
        # one transaction's events in one batch: a batch ends on a whole revision
        assert any(len([e for e in b if e.revision == txn]) == 5 for b in seen)
    finally:
        stop.set()
        thread.join(5)
    assert not thread.is_alive()  # stopped within about a second of being asked


def test_follow_from_a_past_revision_brings_the_history_then_what_comes(store, ns):
    start = store.revision()
    store.put(ns + "h/1", "a")
    store.put(ns + "h/1", "b")
    stop, seen = threading.Event(), []
    thread = _follow_into(store, ns + "h/", start, stop, seen)
    try:
        wait_for(lambda: sum(len(b) for b in seen) >= 2, 10, what="the history")
        store.put(ns + "h/2", "c")
        wait_for(lambda: sum(len(b) for b in seen) >= 3, 10, what="the new put")
    finally:
        stop.set()
        thread.join(5)
    assert [e.value for b in seen for e in b] == ["a", "b", "c"]


def test_changed_since_answers_the_keys_written_after_and_the_whole_count(store, ns):
    store.put_all([(ns + "c/a", "1"), (ns + "c/b", "2"), (ns + "c/c", "3")])
    after = store.revision()
    store.put(ns + "c/b", "2b")
    store.delete(ns + "c/c")
    store.put(ns + "c/d", "4")
    store.put(ns + "other", "not under the prefix")
    at = store.revision()
    got = store.changed_since(ns + "c/", after, at)
    assert got.revision == at
    assert got.kvs == [store.get(ns + "c/b"), store.get(ns + "c/d")]  # values, revisions, sorted by key
    assert got.count == 3  # a (untouched), b, d; c deleted
    assert store.changed_since(ns + "c/", at, at) == Changes(at, [], 3)
    assert store.changed_since(ns + "c/", 0, at).kvs == store.list(ns + "c/")
    assert store.changed_since(ns + "none/", 0, at) == Changes(at, [], 0)
    # written after `at`: etcd answers as of `at`; SQLite keeps no old versions and says it
    # answered as of its current revision
    late = store.put(ns + "c/e", "5")
    got = store.changed_since(ns + "c/", after, at)
    if isinstance(store, EtcdStore):
        assert (got.revision, [kv.key for kv in got.kvs], got.count) == (at, [ns + "c/b", ns + "c/d"], 3)
    else:
        assert (got.revision, [kv.key for kv in got.kvs], got.count) == (late, [ns + "c/b", ns + "c/d", ns + "c/e"], 4)


def test_changed_since_in_one_range_of_the_prefix(store, ns):
    store.put_all([(ns + "c/a", "1"), (ns + "c/b", "2"), (ns + "c/c", "3"), (ns + "c/d", "4")])
    after = store.revision()
    store.put_all([(ns + "c/a", "1a"), (ns + "c/c", "3c"), (ns + "c/d", "4d")])
    at = store.revision()
    parts = [store.changed_since(ns + "c/", after, at, start=lo, end=hi)
             for lo, hi in ((None, ns + "c/b"), (ns + "c/b", ns + "c/d"), (ns + "c/d", None))]
    assert [[kv.key for kv in p.kvs] for p in parts] == [[ns + "c/a"], [ns + "c/c"], [ns + "c/d"]]
    assert [p.count for p in parts] == [1, 2, 1]  # each range's keys: together the prefix's four
    whole = store.changed_since(ns + "c/", after, at)
    assert [kv for p in parts for kv in p.kvs] == whole.kvs and sum(p.count for p in parts) == whole.count
    with pytest.raises(ValueError):
        store.changed_since(ns + "c/", after, at, start=ns + "other")  # a bound outside the prefix


def test_revision_monotonic_across_write_kinds(store, ns):
    seen = [store.revision()]
    seen.append(store.put(ns + "m", "1"))
    store.create(ns + "n", "1")
    seen.append(store.revision())
    store.cas(ns + "n", "2", store.get(ns + "n").mod_revision)
    seen.append(store.revision())
    store.delete(ns + "m")
    seen.append(store.revision())
    assert seen == sorted(set(seen)), seen


# -- backend-specific behaviour ---------------------------------------------------------


def test_sqlite_watch_or_read_before_pruned_history_is_compacted(tmp_path, monkeypatch):
    import common.store.sqlite_store as mod

    monkeypatch.setattr(mod, "EVENTS_KEPT", 5)
    monkeypatch.setattr(mod, "PRUNE_EVERY", 5)
    store = SqliteStore(tmp_path / "s.db")
    for i in range(20):
        store.put("/k", str(i))
    with pytest.raises(Conflict) as err:
        store.watch("/", 1, 0)
    assert err.value.code == "compacted"
    recent = store.watch("/", store.revision() - 2, 0)
    assert [e.value for e in recent] == ["18", "19"]
    with pytest.raises(Conflict) as err:
        store.changed_since("/", 0, 2)  # a revision older than the history kept
    assert err.value.code == "compacted"
    # from a revision whose history is gone, at the current one: what changed since is still known
    assert store.changed_since("/", 1, store.revision()).kvs == [store.get("/k")]
    store.close()


def test_sqlite_file_shared_by_two_handles(tmp_path):
    one, two = SqliteStore(tmp_path / "s.db"), SqliteStore(tmp_path / "s.db")
    rev = one.put("/x", "1")
    assert two.get("/x").mod_revision == rev
    lease = two.grant_lease(60)
    assert one.create("/y", "1", lease=lease.id)
    two.revoke_lease(lease.id)
    assert one.get("/y") is None
    one.close()
    two.close()


def test_etcd_unreachable_is_transient():
    store = EtcdStore("127.0.0.1", free_port(), timeout=2)
    with pytest.raises(TransientError) as err:
        store.get("/fabric/x")
    assert err.value.status == 503
    with pytest.raises(TransientError):
        store.watch("/fabric/", 0, 0.2)
    store.close()


def test_etcd_watch_finishes_a_message_begun_by_its_deadline():
    """The stream's first message arrives in two reads, the deadline passing in between: its
    events are answered, not dropped with the half already read."""
    import base64
    import json

    from common.store.etcd_store import _read_first_events

    def b64(text):
        return base64.b64encode(text.encode()).decode()

    message = json.dumps({"result": {"events": [
        {"kv": {"key": b64("/fabric/a"), "value": b64("v" * 5000), "mod_revision": "7"}}]}}).encode() + b"\n"

    class Stream:
        def iter_content(self, chunk_size=None):
            yield message[:100]
            yield message[100:]

    past = time.monotonic() - 1  # the deadline has passed before the first read
    events = _read_first_events(Stream(), past)  # type: ignore[arg-type]  # the one method it reads
    assert [(e.key, e.value, e.revision) for e in events] == [("/fabric/a", "v" * 5000, 7)]

    class Quiet:
        def iter_content(self, chunk_size=None):
            yield b'{"result": {"created": true}}\n'
            raise AssertionError("read past the deadline with no message begun")

    assert _read_first_events(Quiet(), past) == []  # type: ignore[arg-type]


def test_open_store_urls(tmp_path):
    assert isinstance(open_store(None, tmp_path), SqliteStore)
    assert isinstance(open_store(f"sqlite://{tmp_path / 'x.db'}"), SqliteStore)
    etcd = open_store("etcd://127.0.0.1:2379")
    assert isinstance(etcd, EtcdStore) and etcd.port == 2379
    with pytest.raises(ValueError):
        open_store("etcd://nohostport")
    with pytest.raises(ValueError):
        open_store("redis://x")


def test_prefix_end():
    assert prefix_end("/a/") == "/a0"
    assert prefix_end("") is None
    assert prefix_end("/a\U0010ffff") == "/b"


def test_watch_leaves_no_threads_behind(store, ns):
    before = threading.active_count()
    for _ in range(3):
        assert store.watch(ns, store.revision(), 0.1) == []
    store.put(ns + "x", "1")
    assert len(store.watch(ns, 0, 1)) == 1
    assert threading.active_count() == before


def test_sqlite_handle_survives_fork(tmp_path):
    """A store opened before a fork (pre-fork servers) reopens its connection in the child."""
    import os

    store = SqliteStore(tmp_path / "s.db")
    store.put("/parent", "1")
    pid = os.fork()
    if pid == 0:  # child: write through the inherited handle, report by exit status
        ok = store.create("/child", "1") and store.get("/parent").value == "1"
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert store.get("/child").value == "1"
    store.close()


def test_etcd_watch_or_read_at_a_compacted_revision(etcd_server):
    store = etcd_server.open("root")  # compaction is etcd's administrator's
    ns = f"/fabric/t/compact-{free_port()}/"
    first = store.put(ns + "k", "1")
    store.put(ns + "k", "2")
    latest = store.put(ns + "k", "3")
    store._post("/kv/compaction", {"revision": str(latest), "physical": True})
    with pytest.raises(Conflict) as err:
        store.watch(ns, first, 1)
    assert err.value.code == "compacted"
    assert store.watch(ns, latest, 0.2) == []
    with pytest.raises(Conflict) as err:
        store.changed_since(ns, 0, first)
    assert err.value.code == "compacted"
    with pytest.raises(Conflict) as err:  # a stream from there too
        next(store.follow(ns, first, threading.Event()))
    assert err.value.code == "compacted"
    # read at a revision kept: changes since a compacted one are still known
    assert store.changed_since(ns, first, latest) == Changes(latest, [store.get(ns + "k")], 1)
    store.close()
