"""The embedded store: one SQLite file meeting the etcd-shaped contract in common/store/base.py.

Layout (all in one file, WAL mode so readers never block the writer):
  meta(name, value)      'revision': the store-wide revision (starts at 1, like a fresh etcd);
                         'compacted': events with revision <= this were pruned.
  kv(key, value, create_revision, mod_revision, lease)
  leases(id, ttl, expires_at)   expires_at is wall-clock (time.time()) so every process agrees.
  events(seq, revision, type, key, value)   the watch history; one revision may hold several
                         rows (delete_prefix and a lease expiry delete many keys at one revision).

Invariants:
  - Every write is one short ``BEGIN IMMEDIATE`` transaction, so several processes (and threads)
    on one file serialise on SQLite's write lock; busy_timeout makes them queue, not fail.
  - Expired leases are swept (lease row, its keys, delete events, one revision bump) inside the
    next write and before every read, so no caller ever sees a key whose lease has expired.
  - Events older than the last EVENTS_KEPT revisions, or beyond EVENTS_MAX_BYTES of copied values,
    are pruned (every PRUNE_EVERY revisions); a watch from before the pruned
    point raises Conflict(code="compacted") just as etcd does after a compaction.
"""

from __future__ import annotations

import builtins
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from common.errors import Conflict, NotFound, TransientError
from common.private_fs import private_dir, touch_private
from common.store.base import KV, Changes, Event, Lease, below_nothing, check_range

BUSY_TIMEOUT_MS = 10_000
EVENTS_KEPT = 10_000
# The watch history copies each written value; beyond this many bytes of values the oldest
# revisions go too (a few large values must not grow the file by EVENTS_KEPT copies of them).
EVENTS_MAX_BYTES = 64 * 1024 * 1024
JOURNAL_SIZE_LIMIT = 64 * 1024 * 1024  # the WAL is truncated back to this after a checkpoint
PRUNE_EVERY = 1_000  # revisions between prunes: pruning each write would double the write cost
WATCH_POLL_S = 0.05
_IN_KEYS = 500  # keys per "key IN (...)" query: under SQLite's bound on ? parameters
FOLLOW_POLL_S = 0.25  # follow: an idle prefix's events are read again this often (a Mirror asks the rest)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO meta (name, value) VALUES ('revision', 1), ('compacted', 0);
CREATE TABLE IF NOT EXISTS kv (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL,
    create_revision INTEGER NOT NULL,
    mod_revision INTEGER NOT NULL,
    lease INTEGER
);
CREATE INDEX IF NOT EXISTS kv_lease ON kv (lease) WHERE lease IS NOT NULL;
CREATE TABLE IF NOT EXISTS leases (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    ttl INTEGER NOT NULL,
    expires_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS leases_expiry ON leases (expires_at);
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    revision INTEGER NOT NULL,
    type TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT
);
CREATE INDEX IF NOT EXISTS events_revision ON events (revision);
"""


def prefix_end(prefix: str) -> str | None:
    """The smallest string greater than every string starting with prefix (None: no bound).

    SQLite compares TEXT as UTF-8 bytes, which orders like code points, so bumping the last
    code point gives the exclusive upper bound of the prefix range (etcd's range_end).
    """
    chars = list(prefix)
    while chars:
        last = ord(chars[-1])
        if last < 0x10FFFF:
            chars[-1] = chr(last + 1)
            return "".join(chars)
        chars.pop()
    return None


class SqliteStore:
    """Store backend on one SQLite file; safe from many threads and processes."""

    def __init__(self, path: Path):
        self.path = Path(path)
        # The store holds secrets (the admin-token key): 0600 file in a 0700 directory, and SQLite
        # creates -wal and -shm with the database file's mode, so they are 0600 too. An existing
        # directory keeps its mode (it may be /tmp); fabricd and the gateway make their state dir 0700.
        if not self.path.parent.exists():
            private_dir(self.path.parent)
        touch_private(self.path)
        for suffix in ("-wal", "-shm"):
            side = self.path.with_name(self.path.name + suffix)
            try:
                side.chmod(0o600)
            except FileNotFoundError:
                pass  # none, or another process's last connection just closed it (SQLite removes it then)
        # One connection guarded by a lock: Python's sqlite3 objects are not shareable across
        # threads unguarded, and the write lock is process-wide in SQLite anyway.
        self._lock = threading.Lock()
        self._open()

    def _open(self) -> None:
        self._pid = os.getpid()
        try:
            self._db = sqlite3.connect(
                str(self.path), timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None,
                check_same_thread=False,
            )
            self._db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            self._db.execute("PRAGMA journal_mode = WAL")
            # NORMAL in WAL mode survives process crashes; only an OS crash can lose the last commits.
            self._db.execute("PRAGMA synchronous = NORMAL")
            self._db.execute(f"PRAGMA journal_size_limit = {JOURNAL_SIZE_LIMIT}")
            # Its own transaction: several processes may open a fresh file at once.
            self._db.executescript("BEGIN IMMEDIATE;" + _SCHEMA + "COMMIT;")
        except sqlite3.Error as exc:
            raise TransientError(f"sqlite store {self.path}: {exc}") from exc

    # -- transactions -------------------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        """The connection, reopened in a forked child (an inherited SQLite handle corrupts locks)."""
        if self._pid != os.getpid():
            self._open()
        return self._db

    def _write(self) -> _WriteTxn:
        return _WriteTxn(self)

    def _read(self) -> _ReadTxn:
        return _ReadTxn(self)

    # -- reads --------------------------------------------------------------------------

    def get(self, key: str) -> KV | None:
        with self._read() as db:
            row = db.execute(
                "SELECT key, value, mod_revision, create_revision, lease FROM kv WHERE key = ?", (key,)
            ).fetchone()
        return _kv(row) if row else None

    def get_all(self, keys: builtins.list[str]) -> builtins.list[KV | None]:
        found: dict[str, KV] = {}
        with self._read() as db:
            for i in range(0, len(keys), _IN_KEYS):
                part = keys[i:i + _IN_KEYS]
                found.update((row[0], _kv(row)) for row in db.execute(
                    "SELECT key, value, mod_revision, create_revision, lease FROM kv"
                    f" WHERE key IN ({','.join('?' * len(part))})", part))
        return [found.get(k) for k in keys]

    def list(self, prefix: str) -> list[KV]:
        sql, args = _prefix_clause(prefix)
        with self._read() as db:
            rows = db.execute(
                "SELECT key, value, mod_revision, create_revision, lease FROM kv"
                f" WHERE {sql} ORDER BY key",
                args,
            ).fetchall()
        return [_kv(r) for r in rows]

    def revision(self) -> int:
        with self._read() as db:
            return _meta(db, "revision")

    def changed_since(self, prefix: str, after_revision: int, at_revision: int, *,
                      start: str | None = None, end: str | None = None) -> Changes:
        # kv holds only the current version of each key: the answer is as of the current
        # revision (never older than at_revision), one read snapshot for the rows and the count
        sql, args = _prefix_clause(prefix)
        check_range(prefix, start, end)
        for bound, op in ((start, ">="), (end, "<")):
            if bound is not None:
                sql, args = f"{sql} AND key {op} ?", (*args, bound)
        with self._read() as db:
            rev, compacted = _meta(db, "revision"), _meta(db, "compacted")
            if at_revision > rev:
                raise ValueError(f"changed_since at revision {at_revision}: the store is at {rev}")
            if at_revision < compacted:
                raise Conflict(f"revision {at_revision} is older than the history kept (pruned to {compacted})",
                               code="compacted")
            rows = db.execute(
                "SELECT key, value, mod_revision, create_revision, lease FROM kv"
                f" WHERE {sql} AND mod_revision > ? ORDER BY key",
                (*args, after_revision),
            ).fetchall()
            count = int(db.execute(f"SELECT COUNT(*) FROM kv WHERE {sql}", args).fetchone()[0])
        return Changes(rev, [_kv(r) for r in rows], count)

    # -- writes -------------------------------------------------------------------------

    def put(self, key: str, value: str, *, lease: int | None = None) -> int:
        with self._write() as db:
            _check_lease(db, lease)
            row = db.execute("SELECT create_revision FROM kv WHERE key = ?", (key,)).fetchone()
            rev = _bump(db)
            _upsert(db, key, value, row[0] if row else rev, rev, lease)
            return rev

    def create(self, key: str, value: str, *, lease: int | None = None) -> bool:
        with self._write() as db:
            _check_lease(db, lease)
            if db.execute("SELECT 1 FROM kv WHERE key = ?", (key,)).fetchone():
                return False
            rev = _bump(db)
            _upsert(db, key, value, rev, rev, lease)
            return True

    def create_all(self, items: builtins.list[tuple[str, str]]) -> bool:
        if not items:
            return True
        keys = [key for key, _ in items]
        with self._write() as db:
            # one probe and two executemany per batch, not three statements per row: the audit
            # writer appends every call's rows through here
            for i in range(0, len(keys), _IN_KEYS):
                part = keys[i:i + _IN_KEYS]
                if db.execute(f"SELECT 1 FROM kv WHERE key IN ({','.join('?' * len(part))}) LIMIT 1",
                              part).fetchone():
                    return False
            rev = _bump(db)
            db.executemany(_UPSERT, [(key, value, rev, rev, None) for key, value in items])
            db.executemany(_EVENT, [(rev, key, value) for key, value in items])
            return True

    def put_all(self, items: builtins.list[tuple[str, str]]) -> int:
        if not items:
            return self.revision()
        with self._write() as db:  # one transaction whatever the count: SQLite has no op bound
            rev = _bump(db)
            # _UPSERT keeps an existing key's create_revision: rev is only a new key's
            db.executemany(_UPSERT, [(key, value, rev, rev, None) for key, value in items])
            db.executemany(_EVENT, [(rev, key, value) for key, value in items])
            return rev

    def cas(self, key: str, value: str, mod_revision: int, *, lease: int | None = None) -> bool:
        with self._write() as db:
            _check_lease(db, lease)
            row = db.execute(
                "SELECT create_revision, mod_revision FROM kv WHERE key = ?", (key,)
            ).fetchone()
            if row is None or row[1] != mod_revision:
                return False
            rev = _bump(db)
            _upsert(db, key, value, row[0], rev, lease)
            return True

    def delete(self, key: str, *, mod_revision: int | None = None) -> bool:
        with self._write() as db:
            row = db.execute("SELECT mod_revision FROM kv WHERE key = ?", (key,)).fetchone()
            if row is None or (mod_revision is not None and row[0] != mod_revision):
                return False
            _delete_keys(db, [key], _bump(db))
            return True

    def delete_prefix(self, prefix: str, *, below: str | None = None) -> int:
        sql, args = _prefix_clause(prefix)
        if below is not None:
            if below_nothing(prefix, below):
                return 0
            sql, args = f"{sql} AND key < ?", (*args, below)
        with self._write() as db:
            keys = [r[0] for r in db.execute(f"SELECT key FROM kv WHERE {sql}", args)]
            if keys:
                # One revision for the whole range, as etcd's DeleteRange does.
                _delete_keys(db, keys, _bump(db))
            return len(keys)

    # -- leases -------------------------------------------------------------------------

    def grant_lease(self, ttl: int) -> Lease:
        ttl = max(1, int(ttl))
        with self._write() as db:
            cur = db.execute(
                "INSERT INTO leases (ttl, expires_at) VALUES (?, ?)", (ttl, time.time() + ttl)
            )
            return Lease(id=int(cur.lastrowid or 0), ttl=ttl)  # an INSERT always sets it

    def refresh_lease(self, lease_id: int) -> bool:
        with self._write() as db:
            cur = db.execute(
                "UPDATE leases SET expires_at = ? + ttl WHERE id = ?", (time.time(), lease_id)
            )
            return cur.rowcount == 1

    def revoke_lease(self, lease_id: int) -> None:
        with self._write() as db:
            _drop_leases(db, [lease_id])

    # -- watch --------------------------------------------------------------------------

    def watch(self, prefix: str, after_revision: int, timeout: float) -> builtins.list[Event]:
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            events = self._events_after(prefix, after_revision)
            if events:
                return events
            left = deadline - time.monotonic()
            if left <= 0:
                return []
            time.sleep(min(WATCH_POLL_S, left))

    def follow(self, prefix: str, after_revision: int, stop: threading.Event) -> Iterator[builtins.list[Event]]:
        """The events table read every FOLLOW_POLL_S (a local file has no stream to keep open);
        each read brings every event of the revisions it reaches, so whole revisions."""
        after = after_revision
        while not stop.is_set():
            events = self._events_after(prefix, after)
            if events:
                after = events[-1].revision
                yield events
            else:
                stop.wait(FOLLOW_POLL_S)

    def _events_after(self, prefix: str, after_revision: int) -> builtins.list[Event]:
        """Every event under prefix with revision > after_revision, in order; Conflict "compacted"
        when the history from there was pruned."""
        sql, args = _prefix_clause(prefix)
        with self._read() as db:
            compacted = _meta(db, "compacted")
            if after_revision < compacted:
                raise Conflict(
                    f"watch from revision {after_revision}: history before {compacted} was pruned;"
                    " list again and watch from the list's revision",
                    code="compacted",
                )
            rows = db.execute(
                "SELECT type, key, value, revision FROM events"
                f" WHERE revision > ? AND {sql} ORDER BY seq",
                (after_revision, *args),
            ).fetchall()
        return [Event(type=r[0], key=r[1], value=r[2], revision=r[3]) for r in rows]

    def close(self) -> None:
        with self._lock:
            self._db.close()


class _Txn:
    """Shared by both transaction kinds: they hold the store's thread lock while open."""

    def __init__(self, store: SqliteStore):
        self.store = store

    def _error(self, exc: sqlite3.Error) -> TransientError:
        return TransientError(f"sqlite store {self.store.path}: {exc}")

    def _abort(self) -> None:
        """Roll back whatever is open and let go of the lock."""
        try:
            if self.store._db.in_transaction:
                self.store._db.execute("ROLLBACK")
        finally:
            self.store._lock.release()


class _WriteTxn(_Txn):
    """``with``: the store's thread lock plus BEGIN IMMEDIATE; sweeps expired leases first."""

    def __enter__(self) -> sqlite3.Connection:
        self.store._lock.acquire()
        try:
            self.store._connection().execute("BEGIN IMMEDIATE")
            _sweep(self.store._db)
        except sqlite3.Error as exc:
            self._abort()
            raise self._error(exc) from exc
        except BaseException:
            self._abort()
            raise
        return self.store._db

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                self.store._db.execute("COMMIT")
            else:
                self.store._db.execute("ROLLBACK")
        except sqlite3.Error as err:
            self._abort()
            raise self._error(err) from err
        self.store._lock.release()
        if isinstance(exc, sqlite3.Error):
            raise self._error(exc) from exc


class _ReadTxn(_Txn):
    """``with``: a consistent read snapshot; an expired lease first triggers a sweep (a write)."""

    def __enter__(self) -> sqlite3.Connection:
        self.store._lock.acquire()
        try:
            db = self.store._connection()
            # The cheap indexed probe keeps reads read-only unless a lease really expired.
            if db.execute("SELECT 1 FROM leases WHERE expires_at <= ? LIMIT 1", (time.time(),)).fetchone():
                db.execute("BEGIN IMMEDIATE")
                _sweep(db)
                db.execute("COMMIT")
            db.execute("BEGIN")
        except sqlite3.Error as exc:
            self._abort()
            raise self._error(exc) from exc
        except BaseException:
            self._abort()
            raise
        return db

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if self.store._db.in_transaction:
                self.store._db.execute("COMMIT")
        finally:
            self.store._lock.release()
        if isinstance(exc, sqlite3.Error):
            raise self._error(exc) from exc


# -- helpers running inside a write transaction ----------------------------------------


def _meta(db: sqlite3.Connection, name: str) -> int:
    return int(db.execute("SELECT value FROM meta WHERE name = ?", (name,)).fetchone()[0])


def _bump(db: sqlite3.Connection) -> int:
    rev = _meta(db, "revision") + 1
    db.execute("UPDATE meta SET value = ? WHERE name = 'revision'", (rev,))
    if rev % PRUNE_EVERY == 0:
        floor = max(rev - EVENTS_KEPT, _bytes_floor(db))
        if floor > 0:
            db.execute("DELETE FROM events WHERE revision <= ?", (floor,))
            db.execute("UPDATE meta SET value = MAX(value, ?) WHERE name = 'compacted'", (floor,))
    return rev


def _bytes_floor(db: sqlite3.Connection) -> int:
    """The newest revision whose events, with all newer ones, hold over EVENTS_MAX_BYTES of values (0: none)."""
    row = db.execute(
        "SELECT revision FROM (SELECT revision, SUM(COALESCE(LENGTH(value), 0)) OVER (ORDER BY seq DESC) AS total"
        " FROM events) WHERE total > ? ORDER BY revision DESC LIMIT 1", (EVENTS_MAX_BYTES,)).fetchone()
    return int(row[0]) if row else 0


def _check_lease(db: sqlite3.Connection, lease: int | None) -> None:
    if lease is not None and not db.execute("SELECT 1 FROM leases WHERE id = ?", (lease,)).fetchone():
        raise NotFound(f"lease {lease} not found (expired or revoked)")


_UPSERT = ("INSERT INTO kv (key, value, create_revision, mod_revision, lease) VALUES (?, ?, ?, ?, ?)"
           " ON CONFLICT(key) DO UPDATE SET value = excluded.value,"
           " mod_revision = excluded.mod_revision, lease = excluded.lease")
_EVENT = "INSERT INTO events (revision, type, key, value) VALUES (?, 'put', ?, ?)"


def _upsert(db: sqlite3.Connection, key: str, value: str, create_rev: int, rev: int, lease: int | None) -> None:
    db.execute(_UPSERT, (key, value, create_rev, rev, lease))
    db.execute(_EVENT, (rev, key, value))


def _delete_keys(db: sqlite3.Connection, keys: list[str], rev: int) -> None:
    db.executemany("DELETE FROM kv WHERE key = ?", [(k,) for k in keys])
    db.executemany(
        "INSERT INTO events (revision, type, key, value) VALUES (?, 'delete', ?, NULL)",
        [(rev, k) for k in keys],
    )


def _drop_leases(db: sqlite3.Connection, lease_ids: list[int]) -> None:
    for lease_id in lease_ids:
        db.execute("DELETE FROM leases WHERE id = ?", (lease_id,))
        keys = [r[0] for r in db.execute("SELECT key FROM kv WHERE lease = ? ORDER BY key", (lease_id,))]
        if keys:
            _delete_keys(db, keys, _bump(db))


def _sweep(db: sqlite3.Connection) -> None:
    expired = [r[0] for r in db.execute("SELECT id FROM leases WHERE expires_at <= ?", (time.time(),))]
    if expired:
        _drop_leases(db, expired)


def _prefix_clause(prefix: str) -> tuple[str, tuple]:
    if not prefix:
        return "1 = 1", ()
    end = prefix_end(prefix)
    if end is None:
        return "key >= ?", (prefix,)
    return "key >= ? AND key < ?", (prefix, end)


def _kv(row: tuple) -> KV:
    return KV(key=row[0], value=row[1], mod_revision=row[2], create_revision=row[3], lease=row[4])
