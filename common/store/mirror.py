"""A local copy of the keys under a few prefixes: listed once, then kept current by ``changed_since``.

A reader that looks at the whole fleet often (a gateway's endpoint views twice a second, the
routing pass's snapshot) reads through a Mirror instead of the store: ``fetch()`` reads the
store's revision once and asks each prefix, in one read as of that revision, for the keys written
since the copy's revision and how many keys the prefix holds (``Store.changed_since``), so a
refresh carries O(changes), not O(keys), and its answer does not depend on how soon the store
answers (a watch from a past revision may come late on a busy etcd: an empty answer never said
"caught up"). A prefix whose copy holds SPLIT_KEYS keys or more, and whose last answer carried a
quarter of that or more (churn like that is expected again), is asked as up to MAX_PARTS key
ranges at once, cut at keys the copy holds (etcd answers a range at a cost per key), and each
range's answer is checked for deletions against the keys the copy holds in it; together the
ranges are the prefix's answer. ``follow`` names key spans streamed between fetches, one open
watch each (``Store.follow``): a span holds one or more mirrored prefixes, and a reader names
only spans its store access lets it watch (fabricd: the fleet's root; a gateway, whose etcd role
cannot read all of it: the observations). Events come in revision order, each revision whole, so
a stream whose last event is at W holds every change of its prefixes up to W: a fetch brings
each such prefix's copy to W from the stream, deletions included, and asks ``changed_since``
only from W (not at all when W is the fetch's revision). etcd answers a range at a cost per key
it holds (8,000 keys: 12-17 ms, changed or not) but sends only the keys written since, so a
busy prefix's values reach the copy from the stream, as they are written, and a copy of the
whole root costs its changes only. A stream that failed, or that holds nothing past a prefix's
copy, leaves that prefix to ``changed_since`` from the copy's revision.
Trusted spans (``trust``): a reader whose records under a span are advisory (a gateway's
readings: queue depths an agent scraped seconds ago) may take that span's prefixes only as far as
their open stream brought them, without asking the store, for a while after they were last asked
(the span's trust, in the mirror's clock); once it runs out, or while the span has no open
stream, a fetch asks them as above and they are confirmed. Such a copy lags the store by at most
the stream's delay, and by the trust when a stream stalls without failing. It saves the range
read per fetch whose cost grows with the prefix's keys, changed or not.
``get``/``list``/``revision`` answer from memory for keys under the mirrored
prefixes and fall through to the store for any other key, so the record modules
(common.records) read a Mirror exactly as they read a Store. It has no write verbs.

Invariants:
  - The copy of a prefix holds every key that was live at ``_after[prefix]``, each as it was then
    or newer, and no key deleted by then. A list is recorded at a revision read just before it
    (so it may be ahead; a key it holds newer than that is returned again and skipped), and a
    put older than the key's copy is skipped, so the copy never goes back in time.
  - Deletions: the live keys ``changed_since`` does not return (``count - len(kvs)`` of them)
    were written at or before ``_after[prefix]``, so the copy holds each of them. When it holds
    exactly that many keys of the prefix besides the returned ones, nothing was deleted; when it
    holds more, the prefix is listed again and the keys the list lacks are deleted from the copy.
  - History that is gone (etcd compacted the revision asked at, SQLite pruned it: Conflict
    "compacted") relists that prefix: the copy is rebuilt, never patched past a gap. Other
    store errors (TransientError) reach the caller; the copy stays as it was and the next fetch
    asks again.
  - Every apply that changes something (a put, or a delete) bumps ``version`` once and stamps
    each key it changed with it; ``moved(reads, since)`` says whether any key or listed prefix a
    reader looked at (``Reads``, recorded by ``tracked()``) changed after the version it read at, so a cache recomputes only what a
    change touched. A prefix counts as changed when any key under it (at a "/" boundary) was
    put or deleted. The change record of a deleted key (and of a prefix no key is under any
    more) is kept until such records outnumber the live keys by FORGET_SLACK; then they are
    dropped and each counts as changed at that version (``_forgot``): a reader from before then
    reads again once, and a long-running copy of a churning fleet (replicas made and deleted)
    keeps memory in proportion to its keys.
  - Following: a span's follower holds, per key under its prefixes, what every event after the
    span's floor (the lowest copy revision of its prefixes when it started) through ``through``
    (its last event's revision) leaves the key as (``_Follower.collect``, in its thread: the KV,
    or a deletion). A fetch closes the open batch at ``through`` = W and takes prefix p, whose
    copy is at A < W, to W with what the batches leave p's keys as (``_outcome``: a key the copy
    holds at that revision or later is skipped, since a list can be ahead; a put whose store did
    not say its create_revision keeps the copy's while the copy holds that incarnation), then,
    when W is short of the fetch's revision, asks ``changed_since`` from W, checking deletions
    against the copy as the outcome leaves it. A batch is dropped once every copy revision of
    the span has passed it (an apply), so a fetch that is never applied loses nothing.
Not thread-safe: ``fetch`` (store calls, and reads of the copy) may run in an executor while the
owner's thread reads, never while it applies; ``apply`` and the reads run on the owner's thread
(the followers' threads touch only their buffers, under their lock).
"""

from __future__ import annotations

import bisect
import builtins
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from common.errors import Conflict
from common.store.base import KV, Changes, Event, Store

log = logging.getLogger("fabric.store.mirror")
FORGET_SLACK = 1024  # change records of deleted keys kept beyond the live keys' count
SPLIT_KEYS = 2000  # a prefix holding this many keys or more is asked in parts (Mirror._parts)
MAX_PARTS = 4
FOLLOW_BUFFER = 100_000  # keys a follower holds past the copy before it lets go until a fetch
FOLLOW_RETRY_S = 1.0  # a follower whose stream failed starts again after this


@dataclass
class Fetched:
    """One fetch: per prefix, what changed since the last apply, or a fresh list at a revision."""

    changes: dict[str, Changes] = field(default_factory=dict)
    lists: dict[str, tuple[int, builtins.list[KV]]] = field(default_factory=dict)
    streamed: dict[str, tuple[int, dict[str, KV | None]]] = field(default_factory=dict)  # prefix -> (W, _outcome)
    seen: int | None = None  # the store's revision before the fetch asked anything
    at: float = -math.inf  # the mirror's clock when the fetch started
    asked: set[str] = field(default_factory=set)  # the prefixes asked or listed (the others: trusted to their stream)
    decoded: dict[str, tuple[int, object]] = field(default_factory=dict)  # key -> (mod_revision, decoded)


# a followed key as its span's stream leaves it: (the KV its last event leaves, None when that
# deleted it; that event's revision; the revision of the last deletion the stream brought, 0 if
# none; whether the KV's create_revision is the copy's while the copy holds this incarnation;
# (that revision, decode's answer for the KV) when its prefix names a decode, else None)
_Pending = tuple["KV | None", int, int, bool, "tuple[int, object] | None"]


@dataclass
class _Follower:
    """One span's stream: per mirrored prefix under it, each key its events changed, folded into
    what they leave it as (``_Pending``, made in the follower's thread as the events come). A
    fetch closes the open batch at ``through`` (the last event's revision) and reads every closed
    batch, oldest first (a later one's key holds everything before it); an apply drops the
    closed batches its copy has passed, so a fetch that is never applied loses nothing."""

    through: int
    pending: dict[str, dict[str, _Pending]]  # the open batch: prefix -> key -> what it is left as
    closed: builtins.list[tuple[int, dict[str, dict[str, _Pending]]]] = field(default_factory=list)
    held: int = 0  # keys in the batches

    def collect(self, prefix: str, e: Event, parsed: tuple[int, object] | None) -> None:
        """Fold one event (and decode's answer for a put, where its prefix names one) into its
        key's outcome (the follower's thread, under the lock)."""
        keys = self.pending[prefix]
        prev = keys.get(e.key)
        if prev is None:
            self.held += 1
            for _, batch in reversed(self.closed):
                prev = batch[prefix].get(e.key)
                if prev is not None:
                    break
        if e.type != "put":
            keys[e.key] = (None, e.revision, e.revision, False, None)
            return
        if e.create_revision:  # the store said (etcd)
            create, copy_s = e.create_revision, False
        elif prev is None:  # created here, unless the copy holds the key: then the copy's
            create, copy_s = e.revision, True
        elif prev[0] is None:  # created again after a deletion the stream brought
            create, copy_s = e.revision, False
        else:  # the incarnation of the key's last put here
            create, copy_s = prev[0].create_revision, prev[3]
        keys[e.key] = (KV(e.key, e.value or "", e.revision, create), e.revision, prev[2] if prev else 0, copy_s,
                       parsed)

    def take(self, prefix: str) -> dict[str, _Pending]:
        """Every closed batch's keys of the prefix, the latest of each."""
        if len(self.closed) == 1:
            return self.closed[0][1][prefix]
        out: dict[str, _Pending] = {}
        for _, batch in self.closed:
            out.update(batch[prefix])
        return out


@dataclass
class Reads:
    """What one reader looked at through ``Mirror.tracked()``."""

    keys: set[str] = field(default_factory=set)
    prefixes: set[str] = field(default_factory=set)


class Mirror:
    def __init__(self, store: Store, prefixes: builtins.list[str], follow: Iterable[str] = (),
                 decode: Mapping[str, Callable[[str, str], object]] | None = None,
                 trust: Mapping[str, float] | None = None, clock: Callable[[], float] = time.monotonic):
        """``follow``: key spans streamed between fetches, each holding one or more mirrored
        prefixes and none inside another (the module's docstring); a reader follows only what
        its store access lets it watch. ``decode``: per mirrored prefix, ``fn(key, value)`` ->
        what ``decoded`` answers for its keys (a parsed record; it must not raise), run in the
        follower's thread as the stream brings each put. ``trust``: per followed span, for how
        long (``clock`` seconds) after its prefixes were last asked a fetch takes them only as
        far as their open stream brought them, without asking the store (the module's
        docstring, "Trusted spans")."""
        self.store = store
        self.prefixes = sorted(set(prefixes))
        self.follow = sorted(set(follow))
        self._trust = dict(trust or {})
        if not set(self._trust) <= set(self.follow):
            raise ValueError(f"Mirror: trust {sorted(set(self._trust) - set(self.follow))} is not followed")
        self._clock = clock
        self._confirmed = {p: -math.inf for p in self.prefixes}  # clock at the start of the fetch that last asked it
        self._decode = dict(decode or {})
        self._decoded: dict[str, tuple[int, object]] = {}  # key -> (mod_revision, decode's answer)
        self._span_prefixes = {s: [p for p in self.prefixes if p.startswith(s)] for s in self.follow}
        if any(not held for held in self._span_prefixes.values()):
            raise ValueError(f"Mirror: follow {[s for s, h in self._span_prefixes.items() if not h]} holds no mirrored prefix")
        if any(a != b and b.startswith(a) for a in self.follow for b in self.follow):
            raise ValueError(f"Mirror: follow {self.follow} has a span inside another")
        if not set(self._decode) <= set(self.prefixes):
            raise ValueError(f"Mirror: decode {sorted(set(self._decode) - set(self.prefixes))} is not mirrored")
        self._span_of = {p: s for s, held in self._span_prefixes.items() for p in held}
        self._followers: dict[str, _Follower] = {}  # span -> its stream, while one is open
        self._follow_lock = threading.Lock()
        self._following: set[str] = set()  # spans whose follower thread is started
        self._stop = threading.Event()
        self.prefetched = 0  # changes a fetch took from a stream (tests and benchmarks read it)
        self._prefix_tuple = tuple(self.prefixes)
        self.version = 0  # bumped by each apply that changed something
        self._stamped: set[str] = set()  # the "/"-ended prefixes _bump stamped in this apply
        self.changes_applied = 0  # every change applied since the start (tests and benchmarks read it)
        self.lists = 0  # prefixes listed (first fetch, after a gap, or to find deleted keys)
        self._kvs: dict[str, KV] = {}
        self._sorted: builtins.list[str] | None = []  # the keys in order; None: rebuild at next list
        self._held = {p: 0 for p in self.prefixes}  # prefix -> keys of the copy under it
        self._last_answer = {p: 0 for p in self.prefixes}  # prefix -> keys its last answer or list carried
        # the prefixes are asked at once: one after the other would add their round trips up
        self._pool = ThreadPoolExecutor(max_workers=len(self.prefixes) + MAX_PARTS - 1,
                                        thread_name_prefix="fabric-mirror")
        self._seen: int | None = None  # the store's revision at the last fetch applied
        self._after: dict[str, int | None] = {p: None for p in self.prefixes}  # None: list at next fetch
        self._key_version: dict[str, int] = {}  # key -> version of its last change (deletes kept)
        self._dir_version: dict[str, int] = {}  # "/"-ended prefix -> version of the last change under it
        self._forgot = 0  # a key or prefix with no record above changed at this version at the latest

    # -- keeping the copy ---------------------------------------------------------------------------

    def poll(self) -> int:
        """Fetch and apply in one go (a caller that reads from the same thread)."""
        return self.apply(self.fetch())

    def fetch(self) -> Fetched:
        """What changed under each prefix since the last apply (blocking: store calls; safe in an
        executor while the owner thread reads, since it changes nothing here)."""
        out = Fetched(at=self._clock())
        now = self.store.revision()
        if now == self._seen and all(a is not None and a >= now for a in self._after.values()):
            return out  # nothing was written anywhere since the last fetch: nothing to ask
        out.streamed, out.decoded, trusted = self._streamed(out.at)
        self._ask(out, now, trusted)
        return out

    def _ask(self, out: Fetched, now: int, trusted: set[str]) -> None:
        """``fetch``'s store reads: each prefix's changes since its copy (or where its stream
        brought it), and a list of any that must be listed again; none for a ``trusted`` prefix."""
        # (a prefix whose copy is at ``now`` has nothing to ask: a trusted one left behind it
        # by its stream makes fetches go on while the store does not move)
        tasks = [t for t in self._parts(out.streamed, now) if t[0] not in trusted and t[4] != now]
        out.asked = {t[0] for t in tasks}
        answers = list(self._pool.map(lambda t: self._changes(t[0], t[1], t[2], t[3], t[4], t[5], now), tasks))
        relist = []
        for prefix in self.prefixes:
            mine = [got for (p, *_), got in zip(tasks, answers) if p == prefix]
            parts = [got for got in mine if got is not None]
            if len(parts) < len(mine):
                relist.append(prefix)
                out.streamed.pop(prefix, None)  # the list replaces what the stream brought
            elif mine:  # the parts are disjoint ranges in key order: together, the prefix's answer
                out.changes[prefix] = Changes(min(g.revision for g in parts), [kv for g in parts for kv in g.kvs],
                                              sum(g.count for g in parts))
        for prefix, listed in zip(relist, self._pool.map(self._list, relist)):
            out.lists[prefix] = listed
        out.seen = now

    def _parts(self, streamed: dict[str, tuple[int, dict[str, KV | None]]], now: int,
               ) -> builtins.list[tuple[str, str | None, str | None, int, int | None, dict[str, KV | None]]]:
        """(prefix, start, end, keys the copy holds in that range, since, the stream's outcome)
        per read: a prefix the stream brought to W < now is asked from W in one read (with the
        copy as the stream leaves it), one it brought to ``now`` not at all; of the others, one
        whose copy holds SPLIT_KEYS keys or more and whose last answer carried SPLIT_KEYS / 4
        keys or more is asked in up to MAX_PARTS ranges of about equal size, all at once (etcd
        answers a range at a cost per key; parallel ranges answer sooner), any other in one."""
        keys: builtins.list[str] | None = None
        out: builtins.list[tuple[str, str | None, str | None, int, int | None, dict[str, KV | None]]] = []
        for prefix in self.prefixes:
            after = self._after[prefix]
            if prefix in streamed:
                reached, outcome = streamed[prefix]
                if reached < now:
                    out.append((prefix, None, None, self._held[prefix] + self._grown(outcome), reached, outcome))
                continue
            busy = self._last_answer[prefix] >= SPLIT_KEYS // 4
            n = min(MAX_PARTS, self._held[prefix] // SPLIT_KEYS + 1) if busy and after is not None else 1
            if n < 2:
                out.append((prefix, None, None, self._held[prefix], after, {}))
                continue
            keys = keys if keys is not None else (self._sorted if self._sorted is not None else sorted(self._kvs))
            lo = bisect.bisect_left(keys, prefix)  # the prefix's keys are the _held[prefix] from there
            held = self._held[prefix]
            at = [lo + i * held // n for i in range(n)] + [lo + held]  # each part's first key's index
            bounds = [None, *(keys[i] for i in at[1:-1]), None]
            out += [(prefix, bounds[i], bounds[i + 1], at[i + 1] - at[i], after, {}) for i in range(n)]
        return out

    def _streamed(self, at: float) -> tuple[dict[str, tuple[int, dict[str, KV | None]]],
                                           dict[str, tuple[int, object]], set[str]]:
        """Per prefix a stream has brought past the copy's revision A: (W, what its keys' events
        in (A, W] leave them as), W the revision its span's stream has reached; decode's answers
        for those KVs; and the prefixes trusted to their stream at ``at`` (a trusted span's
        stream open, the prefix asked within the span's trust)."""
        taken: dict[str, tuple[int, dict[str, _Pending]]] = {}
        decoded: dict[str, tuple[int, object]] = {}
        trusted: set[str] = set()
        with self._follow_lock:
            for span, f in self._followers.items():
                trust = self._trust.get(span)
                if trust is not None:
                    trusted.update(p for p in f.pending if self._after[p] is not None
                                   and at - self._confirmed[p] < trust)
                if any(f.pending.values()):  # close the open batch: what comes next is the next fetch's
                    f.closed.append((f.through, f.pending))
                    f.pending = {p: {} for p in f.pending}
                for prefix in f.pending:
                    after = self._after[prefix]
                    if after is not None and after < f.through and f.closed:
                        taken[prefix] = (f.through, f.take(prefix))
        return {p: (reached, self._outcome(keys, decoded)) for p, (reached, keys) in taken.items()}, decoded, trusted

    def _outcome(self, keys: dict[str, _Pending], decoded: dict[str, tuple[int, object]]) -> dict[str, KV | None]:
        """Each key the stream changed, as it leaves it: its KV, or None when it deletes a key the
        copy holds. A key the copy holds at that revision or later is skipped (a list can be
        ahead); one whose create_revision the stream did not say keeps the copy's while the
        copy holds that incarnation (no deletion since the copy's revision of it). Decode's
        answer for each KV kept goes to ``decoded``."""
        out: dict[str, KV | None] = {}
        copy = self._kvs
        for key, (kv, rev, deleted, copy_s, parsed) in keys.items():
            held = copy.get(key)
            if held is not None and held.mod_revision >= rev:
                continue
            if kv is None:
                if held is not None:
                    out[key] = None
                continue
            if held is not None and copy_s and deleted <= held.mod_revision:
                kv = KV(key, kv.value, rev, held.create_revision)
            out[key] = kv
            if parsed is not None:
                decoded[key] = parsed
        return out

    def _grown(self, outcome: dict[str, KV | None]) -> int:
        """How many keys the copy gains (created less deleted) when ``outcome`` is applied."""
        copy = self._kvs
        return sum((kv is not None) - (key in copy) for key, kv in outcome.items())

    def _changes(self, prefix: str, start: str | None, end: str | None, held: int, since: int | None,
                 outcome: dict[str, KV | None], now: int) -> Changes | None:
        """The changes in one range of the prefix since revision ``since`` (the copy's, or where
        its stream brought it: ``outcome`` applied; ``held``: the keys the copy then holds in
        the range); None when the prefix must be listed again (never listed, history compacted,
        or keys deleted in the range)."""
        if since is None:
            return None
        try:
            got = self.store.changed_since(prefix, since, now, start=start, end=end)
        except Conflict as exc:
            if exc.code != "compacted":
                raise
            log.info("mirror of %s: %s; listing again", prefix, exc.message)
            return None
        # the copy's keys in the range besides those written since: exactly the untouched live
        # ones unless some were deleted (the module's invariants)
        copy = self._kvs
        untouched = held - sum((outcome[kv.key] is not None) if kv.key in outcome else (kv.key in copy)
                               for kv in got.kvs)
        if untouched != got.count - len(got.kvs):
            return None
        return got

    def _list(self, prefix: str) -> tuple[int, builtins.list[KV]]:
        rev = self.store.revision()  # before the list: a key written in between is asked about again
        return rev, self.store.list(prefix)

    def apply(self, fetched: Fetched) -> int:
        """Apply what ``fetch`` brought (fast, in memory); returns the changes applied."""
        applied = 0
        self.version += 1  # every change of this apply is stamped with it (taken back if none)
        self._stamped.clear()
        if fetched.seen is not None:
            self._seen = fetched.seen
        for prefix in fetched.asked:
            self._confirmed[prefix] = fetched.at
        for prefix, (rev, kvs) in fetched.lists.items():
            applied += self._relist(prefix, rev, kvs)
            self._last_answer[prefix] = 0  # a list is the prefix's size, not its churn (_parts)
        # the streamed keys, before the answers from there on: the hot path of a busy fleet
        # (every agent's report), so a key the copy holds is replaced in place
        copy, decoded, mine = self._kvs, fetched.decoded, self._decoded
        for prefix, (reached, outcome) in fetched.streamed.items():
            streamed = 0
            for key, kv in outcome.items():
                held = copy.get(key)
                if kv is None:
                    self._drop(key)  # _outcome deletes only keys the copy holds
                elif held is None:
                    self._hold(kv, new=True)
                else:
                    copy[key] = kv
                parsed = decoded.get(key)  # decode's answer for this KV (_outcome)
                if parsed is not None:
                    mine[key] = parsed
                streamed += self._bump(key)
            self._last_answer[prefix] = len(outcome)
            self._after[prefix] = max(self._after[prefix] or 0, reached)
            self.prefetched += streamed
            applied += streamed
        for prefix, got in fetched.changes.items():
            self._last_answer[prefix] = max(self._last_answer[prefix] if prefix in fetched.streamed else 0,
                                            len(got.kvs))
            for kv in got.kvs:
                applied += self._put(kv)
            self._after[prefix] = max(self._after[prefix] or 0, got.revision)
        if not applied:
            self.version -= 1  # nothing was stamped with it
        self._follow_on()
        if len(self._key_version) > 2 * len(self._kvs) + FORGET_SLACK:
            self._forget()
        self.changes_applied += applied
        return applied

    def _floor(self, span: str) -> int | None:
        """The oldest copy revision of the span's prefixes (None: one has no copy yet)."""
        afters = [self._after[p] for p in self._span_prefixes[span]]
        return None if None in afters else min(afters)  # type: ignore[type-var]

    def _follow_on(self) -> None:
        """Start each span's stream once its prefixes have a copy, and drop the closed batches
        the copy has passed."""
        for span in self.follow:
            floor = self._floor(span)
            if floor is None:
                continue
            if span not in self._following:
                self._following.add(span)
                threading.Thread(target=self._follow_span, args=(span,), daemon=True,
                                 name="fabric-mirror-follow").start()
            with self._follow_lock:
                f = self._followers.get(span)
                if f is None:
                    continue
                while f.closed and f.closed[0][0] <= floor:
                    f.held -= sum(len(keys) for keys in f.closed.pop(0)[1].values())

    def _follow_span(self, span: str) -> None:
        """A follower thread: stream the span from its prefixes' oldest copy revision, again after
        a failure (FOLLOW_RETRY_S later; a failure is logged when it differs from the last) or
        once fetches caught up with a full buffer."""
        failed = ""
        mine_of = self._span_prefixes[span]
        while not self._stop.is_set():
            start = self._floor(span)
            assert start is not None  # started once its prefixes had a copy; they only move on
            f = _Follower(start, {p: {} for p in mine_of})
            with self._follow_lock:
                self._followers[span] = f
            try:
                for events in self.store.follow(span, start, self._stop):
                    mine = [(p, e, (e.revision, self._decode[p](e.key, e.value))
                             if p in self._decode and e.type == "put" and e.value is not None else None)
                            for e in events for p in mine_of if e.key.startswith(p)]
                    with self._follow_lock:
                        if f.held + len(mine) > FOLLOW_BUFFER:  # nobody fetches: hold no more, and
                            del self._followers[span]  # let fetches ask the store until the copy moves on
                            break
                        for p, e, parsed in mine:
                            f.collect(p, e, parsed)
                        f.through = events[-1].revision
                    failed = ""
                else:
                    continue  # the stream ended: stopped (the loop's test), or open it again
                while not self._stop.is_set() and self._floor(span) == start:
                    self._stop.wait(FOLLOW_RETRY_S)
            except Exception as exc:  # noqa: BLE001  fetches ask the store meanwhile
                if str(exc) != failed:
                    log.info("mirror of %s: stream stopped (%s); starting again", span, exc)
                failed = str(exc)
                self._stop.wait(FOLLOW_RETRY_S)
            finally:
                with self._follow_lock:
                    if self._followers.get(span) is f:
                        del self._followers[span]

    def _forget(self) -> None:
        """Drop the change records of keys (and prefixes) that hold nothing now; ``moved`` reads
        them as changed at this version (see the module's invariants)."""
        self._key_version = {k: v for k, v in self._key_version.items() if k in self._kvs}
        live: set[str] = set()
        for key in self._kvs:
            cut = key.rfind("/")
            while cut > 0 and key[:cut + 1] not in live:
                live.add(key[:cut + 1])
                cut = key.rfind("/", 0, cut)
        self._dir_version = {d: v for d, v in self._dir_version.items() if d in live}
        self._forgot = self.version

    def _relist(self, prefix: str, rev: int, kvs: builtins.list[KV]) -> int:
        listed = {kv.key: kv for kv in kvs}
        self.lists += 1
        changed = 0
        for key in [k for k in self._kvs if k.startswith(prefix) and k not in listed]:
            self._drop(key)
            changed += self._bump(key)
        for key, kv in listed.items():
            old = self._kvs.get(key)
            if old != kv:
                self._hold(kv, new=old is None)
                changed += self._bump(key)
        self._after[prefix] = rev
        return changed

    def _put(self, kv: KV) -> int:
        old = self._kvs.get(kv.key)
        if old is not None and old.mod_revision >= kv.mod_revision:
            return 0  # the list already had this key at this revision or later
        self._hold(kv, new=old is None)
        return self._bump(kv.key)

    def _hold(self, kv: KV, new: bool) -> None:
        self._kvs[kv.key] = kv
        if new:
            self._sorted = None
            for p in self.prefixes:
                if kv.key.startswith(p):
                    self._held[p] += 1

    def _drop(self, key: str) -> None:
        del self._kvs[key]
        self._decoded.pop(key, None)
        self._sorted = None
        for p in self.prefixes:
            if key.startswith(p):
                self._held[p] -= 1

    def _bump(self, key: str) -> int:
        """Record a change of ``key`` at this apply's version: the key's, and every "/"-ended
        prefix above it (each stamped once per apply)."""
        self._key_version[key] = self.version
        cut = key.rfind("/")
        if key[:cut + 1] in self._stamped:
            return 1  # it and the prefixes above it are stamped already
        while cut > 0:
            above = key[:cut + 1]
            if above in self._stamped:
                break
            self._stamped.add(above)
            self._dir_version[above] = self.version
            cut = key.rfind("/", 0, cut)
        return 1

    def _mirrored(self, key: str) -> bool:
        return key.startswith(self._prefix_tuple)  # one C call for every prefix (a get's hot path)

    # -- reading (the Store read verbs) --------------------------------------------------------------

    def get(self, key: str) -> KV | None:
        return self._kvs.get(key) if self._mirrored(key) else self.store.get(key)

    def list(self, prefix: str) -> builtins.list[KV]:
        if not self._mirrored(prefix):
            return self.store.list(prefix)
        if self._sorted is None:
            self._sorted = sorted(self._kvs)
        keys = self._sorted
        out = []
        for i in range(bisect.bisect_left(keys, prefix), len(keys)):
            if not keys[i].startswith(prefix):
                break
            out.append(self._kvs[keys[i]])
        return out

    def revision(self) -> int:
        return self.store.revision()

    def decoded(self, key: str) -> object | None:
        """``decode``'s answer for the copy's value of a key under a prefix it names (decoded in
        the follower's thread when the stream brought it, else here, once per revision); None
        when the copy has no such key or no decode is named for it."""
        kv = self._kvs.get(key)
        if kv is None:
            return None
        held = self._decoded.get(key)
        if held is not None and held[0] == kv.mod_revision:
            return held[1]
        fn = next((fn for p, fn in self._decode.items() if key.startswith(p)), None)
        if fn is None:
            return None
        obj = fn(key, kv.value)
        self._decoded[key] = (kv.mod_revision, obj)
        return obj

    def confirmed_at(self, prefix: str) -> float:
        """The mirror's clock when the prefix was last asked of the store (-inf: never)."""
        return self._confirmed[prefix]

    def stream_reached(self, span: str) -> int | None:
        """The revision of the last event the span's open stream brought (None: none open)."""
        with self._follow_lock:
            f = self._followers.get(span)
            return None if f is None else f.through

    def close(self) -> None:
        """Stop the fetch and follow threads; the store belongs to whoever opened it."""
        self._stop.set()
        self._pool.shutdown(wait=False)

    def tracked(self) -> tuple[_Tracked, Reads]:
        """A read view that records what it is asked, for ``moved``."""
        reads = Reads()
        return _Tracked(self, reads), reads

    def moved(self, reads: Reads, since: int) -> bool:
        """Whether anything ``reads`` looked at changed after version ``since``."""
        if any(not self._mirrored(k) for k in reads.keys) or any(not self._mirrored(p) for p in reads.prefixes):
            return True  # read from the store itself: no change record, so always read again
        if any(self._key_moved(k, since) for k in reads.keys):
            return True
        return any(self._prefix_version(p) > since for p in reads.prefixes)

    def _key_moved(self, key: str, since: int) -> bool:
        return self._key_version.get(key, self._forgot) > since

    def _prefix_version(self, prefix: str) -> int:
        if prefix.endswith("/"):
            return self._dir_version.get(prefix, self._forgot)
        return self.version  # not at a "/" boundary: no record of its own, so any change counts


class _Tracked:
    """Mirror reads that note each key and prefix asked (Mirror.tracked)."""

    def __init__(self, mirror: Mirror, reads: Reads):
        self._mirror, self._reads = mirror, reads

    def get(self, key: str) -> KV | None:
        self._reads.keys.add(key)
        return self._mirror.get(key)

    def list(self, prefix: str) -> builtins.list[KV]:
        self._reads.prefixes.add(prefix)
        return self._mirror.list(prefix)

    def revision(self) -> int:
        return self._mirror.revision()
