"""common.store.mirror: listed once, then only the changes, on SQLite and a real etcd alike."""

from __future__ import annotations

from common.errors import Conflict
from common.store import mirror as mirror_module
from common.store.locks import FencedStore
from common.store.mirror import Mirror, Reads
from lab.rigs.scale import CountingStore


def exact(mirror, store, prefixes):
    return all(mirror.list(p) == store.list(p) for p in prefixes)


def test_lists_once_then_applies_only_changes(store, ns):
    store.put_all([(ns + f"r/d1/{i}", f"v{i}") for i in range(5)] + [(ns + "r/d2/0", "x"), (ns + "e/a", "1")])
    counted = CountingStore(store)
    mirror = Mirror(counted, [ns + "r/", ns + "e/"])
    assert mirror.poll() == 7 and counted.calls.get("list", 0) == 2
    assert [kv.value for kv in mirror.list(ns + "r/d1/")] == [f"v{i}" for i in range(5)]
    assert mirror.poll() == 0  # nothing changed: no list, nothing applied
    store.put(ns + "r/d1/2", "new")
    store.put(ns + "other", "not mirrored")
    assert mirror.poll() == 1 and counted.calls.get("list", 0) == 2  # a put: no list
    assert mirror.get(ns + "r/d1/2") == store.get(ns + "r/d1/2")  # value and revisions
    assert mirror.get(ns + "other").value == "not mirrored"  # falls through
    store.delete(ns + "r/d2/0")
    assert mirror.poll() == 1 and counted.calls.get("list", 0) == 3  # a delete: its prefix listed again
    assert mirror.get(ns + "r/d2/0") is None and mirror.list(ns + "r/d2/") == []
    assert exact(mirror, store, [ns + "r/", ns + "e/"]) and mirror.lists == 3


def test_a_large_prefix_is_asked_in_parts_and_the_copy_stays_exact(store, ns, monkeypatch):
    """Past SPLIT_KEYS keys a prefix whose last answer churned is asked in ranges at once
    (MAX_PARTS at most): puts in every range, a key new between two cut keys, and a delete in one
    range all reach the copy. Right after its list it is asked in one read: a list is its size."""
    monkeypatch.setattr(mirror_module, "SPLIT_KEYS", 4)
    store.put_all([(ns + f"o/{i:02d}", "0") for i in range(16)] + [(ns + "e/a", "1")])
    counted = CountingStore(store)
    mirror = Mirror(counted, [ns + "o/", ns + "e/"])
    mirror.poll()
    asked = counted.calls.get("changed_since", 0)
    store.put_all([(ns + f"o/{i:02d}", "2") for i in range(1, 16, 3)])  # churn: 5 keys in one answer
    assert mirror.poll() == 5
    assert counted.calls.get("changed_since", 0) - asked == 2  # one read each, o/ right after its list
    asked = counted.calls.get("changed_since", 0)
    store.put_all([(ns + f"o/{i:02d}", "1") for i in range(0, 16, 3)] + [(ns + "o/05x", "new")])
    assert mirror.poll() == 7
    assert counted.calls.get("changed_since", 0) - asked == mirror_module.MAX_PARTS + 1  # four ranges, and e/
    assert exact(mirror, store, [ns + "o/", ns + "e/"]) and mirror.lists == 2
    store.delete(ns + "o/09")
    mirror.poll()
    assert exact(mirror, store, [ns + "o/", ns + "e/"]) and mirror.lists == 3  # that prefix listed again
    assert mirror.get(ns + "o/09") is None and mirror.get(ns + "o/05x").value == "new"


def test_a_key_deleted_and_another_created_between_fetches(store, ns):
    """The prefix holds as many keys as before: the copy still finds the one that went."""
    store.put_all([(ns + "r/a", "1"), (ns + "r/b", "2"), (ns + "r/c", "3")])
    mirror = Mirror(store, [ns + "r/"])
    mirror.poll()
    view, reads = mirror.tracked()
    assert view.get(ns + "r/b").value == "2"
    at = mirror.version
    store.delete(ns + "r/b")
    store.put(ns + "r/d", "4")
    assert mirror.poll() == 2  # the delete and the put, each a change
    assert exact(mirror, store, [ns + "r/"]) and [kv.key for kv in mirror.list(ns + "r/")] == [
        ns + "r/a", ns + "r/c", ns + "r/d"]
    assert mirror.moved(reads, at)  # the deleted key's reader reads again
    # deleted and created again between fetches: the new key, at its new revision
    store.delete(ns + "r/a")
    store.put(ns + "r/a", "back")
    assert mirror.poll() == 1 and exact(mirror, store, [ns + "r/"])


def test_a_copy_catches_up_however_late_the_stores_watch_answers(store, ns):
    """5,000 writes, then one fetch: the copy is exact. A busy etcd answers a watch from a past
    revision only when its sync loop gets to it (an empty first answer although history is
    there); this store's watch does so every time, and the copy does not depend on it."""

    class LateHistory(CountingStore):
        def watch(self, prefix, after_revision, timeout):
            return []

    items = [(ns + f"o/r{i:05d}", "v" * 100) for i in range(5000)]
    store.put(ns + "o/r00000", "first")
    mirror = Mirror(LateHistory(store), [ns + "o/", ns + "p/"])
    mirror.poll()
    for k in range(0, len(items), 1000):
        store.put_all(items[k:k + 1000])
    store.put(ns + "p/plan", "p")
    assert mirror.poll() == 5001
    assert exact(mirror, store, [ns + "o/", ns + "p/"]) and mirror.lists == 2


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
    # which keys moved: only the one written since, and a key outside the copy always
    store.put_all([(ns + "o/1", "x"), (ns + "o/2", "y")])
    mirror.poll()
    at = mirror.version
    store.put(ns + "o/2", "y2")
    mirror.poll()
    keys = [ns + "o/0", ns + "o/1", ns + "o/2", ns + "elsewhere"]
    assert {k for k in keys if mirror.moved(Reads(keys={k}), at)} == {ns + "o/2", ns + "elsewhere"}


def test_a_gap_in_history_lists_again(store, ns):
    store.put(ns + "k/a", "1")

    class Compacted(CountingStore):
        def changed_since(self, prefix, after_revision, at_revision, **_range):
            raise Conflict("history before this revision was compacted", code="compacted")

    mirror = Mirror(store, [ns + "k/"])
    mirror.poll()
    store.delete(ns + "k/a")
    store.put(ns + "k/b", "2")
    gapped = Compacted(store)
    mirror.store = gapped
    assert mirror.poll() == 2 and gapped.calls.get("list", 0) == 1
    assert [kv.key for kv in mirror.list(ns + "k/")] == [ns + "k/b"]


def test_the_leaders_fenced_store_reads_changes_through(store, ns):
    store.put(ns + "k/a", "1")
    mirror = Mirror(FencedStore(store, lock=None), [ns + "k/"])  # type: ignore[arg-type]  # reads only
    mirror.poll()
    store.put(ns + "k/a", "2")
    assert mirror.poll() == 1 and mirror.get(ns + "k/a") == store.get(ns + "k/a")


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


def _streamed_up_to(mirror, revision):
    """Wait until every span's stream has brought every event through ``revision``."""
    from lab.rigs.polling import wait_for

    wait_for(lambda: all((mirror.stream_reached(span) or 0) >= revision for span in mirror.follow), 10,
             what=f"the stream at revision {revision}", interval=0.02)


def test_a_followed_span_brings_every_change_from_the_stream_and_the_copy_stays_exact(store, ns):
    """Once the stream has reached a fetch's revision, every mirrored prefix's changes come from
    it -- puts, deletions, a key created and one deleted and created again -- and the store is
    asked nothing but its revision; the copy is exact throughout, revisions included, and a
    decoded prefix is parsed once, in the stream's thread."""
    span = ns + "m/"
    o, e = span + "o/", span + "e/"
    store.put_all([(o + str(i), f"v{i}") for i in range(6)] + [(e + "a", "1")])
    decoded_in: list[str] = []

    def decode(key, value):
        decoded_in.append(key)
        return value.upper()
    counted = CountingStore(store)
    mirror = Mirror(counted, [o, e], follow=[span], decode={o: decode})
    try:
        mirror.poll()
        rev = store.put_all([(o + "1", "w1"), (o + "new", "n")])
        store.put(o + "1", "w2")  # two puts of one key: the copy holds the last
        store.put(e + "b", "2")
        store.put(span + "not-mirrored", "x")  # in the span, under no prefix: moves the stream only
        store.delete(o + "4")
        store.delete(o + "5")
        again = store.put(o + "5", "back")  # deleted and created again: a new create_revision
        last = store.put(o + "2", "w3")
        _streamed_up_to(mirror, last)
        asked = dict(counted.calls)
        assert mirror.poll() == 6 and mirror.prefetched == 6 and mirror.lists == 2  # each key changed
        assert {k: v - asked.get(k, 0) for k, v in counted.calls.items() if v != asked.get(k, 0)} == {"revision": 1}
        assert exact(mirror, store, [o, e]) and mirror.get(o + "4") is None
        assert mirror.get(o + "new").create_revision == rev  # created by its first streamed put
        assert mirror.get(o + "5").create_revision == again
        assert mirror.get(o + "1").create_revision == store.get(o + "1").create_revision
        # decoded once, in the stream's thread; an unstreamed key is decoded when first read
        assert mirror.decoded(o + "2") == "W3" and mirror.decoded(o + "0") == "V0"
        assert decoded_in.count(o + "2") == 1 and mirror.decoded(o + "0") == "V0"
        assert decoded_in.count(o + "0") == 1 and mirror.decoded(o + "gone") is None
        assert mirror.decoded(e + "a") is None  # no decode named for that prefix
    finally:
        mirror.close()


def test_a_stream_behind_the_stores_revision_brings_the_copy_to_where_it_reached(store, ns):
    """A write outside the span moves the store's revision where the stream never goes: the
    stream brings the copy to its last event (a deletion included: nothing is listed), and
    changed_since is asked once, from there; the copy is exact."""
    o, counted, mirror = _followed(store, ns, ("v0", "v1", "v2"))
    try:
        store.put(o + "1", "w1")
        _streamed_up_to(mirror, store.delete(o + "2") and store.revision())
        store.put(ns + "outside", "x")  # the last write: the stream never reaches the store's revision
        asked, streamed, lists = counted.calls.get("changed_since", 0), mirror.prefetched, mirror.lists
        assert mirror.poll() == 2 and mirror.prefetched == streamed + 2 and mirror.lists == lists
        assert counted.calls.get("changed_since", 0) == asked + 1 and exact(mirror, store, [o])
        store.put(o + "0", "w0")
        store.put(ns + "outside", "y")
        mirror.poll()  # streamed or asked, whichever the stream reached: exact either way
        assert exact(mirror, store, [o])
    finally:
        mirror.close()


def _followed(store, ns, values=("v", "v", "v")):
    """A mirror of one prefix (``o``, holding a key per value) that follows its span, polled once."""
    o = ns + "m/o/"
    store.put_all([(o + str(i), v) for i, v in enumerate(values)])
    counted = CountingStore(store)
    mirror = Mirror(counted, [o], follow=[ns + "m/"])
    mirror.poll()
    return o, counted, mirror


def test_a_fetch_never_applied_loses_nothing_the_stream_brought(store, ns):
    """A fetch closes the stream's batch but drops nothing: one whose answer is never applied
    (its caller failed) leaves the next fetch every change, still from the stream alone."""
    o, counted, mirror = _followed(store, ns)
    try:
        store.put(o + "0", "w")
        store.delete(o + "1")
        _streamed_up_to(mirror, store.revision())
        assert o + "1" in mirror.fetch().streamed[o][1]  # brought, then never applied
        _streamed_up_to(mirror, store.put(o + "2", "x"))
        asked = counted.calls.get("changed_since", 0)
        assert mirror.poll() == 3 and mirror.get(o + "1") is None and exact(mirror, store, [o])
        assert counted.calls.get("changed_since", 0) == asked  # every change from the stream
    finally:
        mirror.close()


def test_a_stream_past_its_buffer_stops_until_the_copy_moves_on(store, ns, monkeypatch):
    """More unfetched events than FOLLOW_BUFFER: the stream lets go (fetches ask changed_since),
    and opens again from the copy's revision once a fetch moved it; the copy is exact throughout."""
    from lab.rigs.polling import wait_for

    monkeypatch.setattr(mirror_module, "FOLLOW_BUFFER", 3)
    span = ns + "m/"
    o, counted, mirror = _followed(store, ns)
    try:
        _streamed_up_to(mirror, store.put(o + "0", "w"))
        for i in range(4):
            store.put(o + f"n{i}", "x")
        wait_for(lambda: span not in mirror._followers, 10, what="the stream letting go", interval=0.02)
        asked = counted.calls.get("changed_since", 0)
        mirror.poll()
        assert counted.calls.get("changed_since", 0) == asked + 1 and exact(mirror, store, [o])
        _streamed_up_to(mirror, store.put(o + "1", "again"))  # open again, from the copy's revision
        asked, streamed = counted.calls.get("changed_since", 0), mirror.prefetched
        mirror.poll()
        assert counted.calls.get("changed_since", 0) == asked and mirror.prefetched == streamed + 1
        assert exact(mirror, store, [o])
    finally:
        mirror.close()


def test_follow_and_decode_name_only_mirrored_prefixes(store, ns):
    import pytest

    with pytest.raises(ValueError, match="holds no mirrored prefix"):
        Mirror(store, [ns + "o/", ns + "e/"], follow=[ns + "x/"])
    with pytest.raises(ValueError, match="a span inside another"):
        Mirror(store, [ns + "o/", ns + "e/"], follow=[ns, ns + "o/"])
    with pytest.raises(ValueError, match="not mirrored"):
        Mirror(store, [ns + "o/"], decode={ns + "x/": str})


def test_a_trusted_span_is_taken_from_its_stream_and_confirmed_once_its_trust_runs_out(store, ns):
    """Within the span's trust a fetch takes its prefix only as far as the stream brought it,
    however far the store's revision moved elsewhere: no changed_since, the copy at the stream's
    last event. Once the trust runs out (the mirror's clock), the next fetch asks the store from
    there and the copy is exact; a prefix outside the span is asked every fetch as before."""
    span = ns + "m/"
    o, other = span + "o/", ns + "r/"
    store.put_all([(o + "0", "v"), (o + "1", "v"), (other + "a", "1")])
    counted, clock = CountingStore(store), [0.0]
    mirror = Mirror(counted, [o, other], follow=[span], trust={span: 5.0}, clock=lambda: clock[0])
    try:
        mirror.poll()
        for step in range(3):  # clock 1, 2, 3: within the trust
            clock[0] += 1.0
            _streamed_up_to(mirror, store.put(o + "0", f"w{step}"))
            store.put(other + "a", str(step))  # the store moves past the stream's last event
            asked = counted.calls.get("changed_since", 0)
            assert mirror.poll() == 2
            assert counted.calls.get("changed_since", 0) == asked + 1  # other/ alone
            assert mirror.get(o + "0").value == f"w{step}" and exact(mirror, store, [o, other])
        asked = counted.calls.get("changed_since", 0)
        assert mirror.poll() == 0 and counted.calls.get("changed_since", 0) == asked  # nothing written
        clock[0] += 5.0  # past the trust: confirmed against the store, from the stream's last event
        store.put(ns + "outside", "x")
        mirror.poll()
        assert counted.calls.get("changed_since", 0) == asked + 2 and exact(mirror, store, [o, other])
        asked = counted.calls.get("changed_since", 0)
        store.put(ns + "outside", "y")  # trusted again from the confirmation on: other/ alone asked
        mirror.poll()
        assert counted.calls.get("changed_since", 0) == asked + 1
    finally:
        mirror.close()


def test_a_trusted_span_whose_stream_stalls_is_exact_once_its_trust_runs_out(store, ns):
    """A stream that stalls without failing brings nothing: within the trust the copy keeps what
    it had; once the trust runs out a fetch asks the store and the copy is exact, a deletion
    included. Without a trust the same fetch would have asked at once."""
    class Stalled(CountingStore):
        def follow(self, prefix, after_revision, stop):
            stop.wait()  # open, and never a word
            return iter(())

    span = ns + "m/"
    o = span + "o/"
    store.put_all([(o + "0", "v"), (o + "1", "v")])
    clock = [0.0]
    mirror = Mirror(Stalled(store), [o], follow=[span], trust={span: 5.0}, clock=lambda: clock[0])
    try:
        mirror.poll()
        from lab.rigs.polling import wait_for
        wait_for(lambda: span in mirror._followers, 10, what="the stream opened", interval=0.02)
        store.put(o + "0", "w")
        store.delete(o + "1")
        clock[0] += 1.0
        assert mirror.poll() == 0 and mirror.get(o + "0").value == "v"  # trusted: the stream said nothing
        clock[0] += 5.0
        assert mirror.poll() == 2 and exact(mirror, store, [o]) and mirror.get(o + "1") is None
    finally:
        mirror.close()


def test_trust_names_only_a_followed_span(store, ns):
    import pytest

    with pytest.raises(ValueError, match="is not followed"):
        Mirror(store, [ns + "o/"], follow=[], trust={ns + "o/": 1.0})
