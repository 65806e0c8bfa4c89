"""The HA store: etcd v3 through its JSON gateway (etcd3gw), meeting common/store/base.py.

etcd3gw covers only part of what the contract needs (its put drops the revision, its txn helpers
base64 str as latin-1, its watcher runs a thread pool), so this module posts the v3 JSON API
through the etcd3gw client's own ``post``/``get_url`` and builds the payloads itself:
  - keys and values are UTF-8, base64-encoded on the wire;
  - int64 fields arrive as JSON strings and fields at their zero value are omitted
    (a failed txn has no ``succeeded``, a PUT event has no ``type``);
  - create = txn[create_revision == 0] put; cas = txn[mod_revision == N] put;
    delete at a revision = txn[mod_revision == N] delete.
Watch opens one streaming HTTP request of its own, reads until the first batch of events or the
deadline (finishing a message begun by then), and closes it: no background threads, no pooled
connection left half-read.
Unreachable etcd raises TransientError; a write naming an unknown lease raises NotFound.

A cluster is reached through several endpoints (``etcd://h1:p1,h2:p2,h3:p3``). Calls go to the
current endpoint; one whose connection is refused or cannot be opened (the request never left
this process, so nothing can have been applied) is skipped and the call goes to the next, which
becomes current. A failure after the request was sent (a reset, a read timeout, an etcd error
such as "no leader") is not retried here, where a create or a cas could run twice: it raises
TransientError naming the endpoint, and the next call starts from the next endpoint.

Security (common.store.etcd_access): with TLS settings every member is reached over HTTPS that
verifies FABRIC_ETCD_CA and presents the client certificate; with a login the store
authenticates once (POST /v3/auth/authenticate) and sends the token on every call, logging in
again once when etcd says the token expired (etcd refused the call before applying it, so the
retry cannot apply anything twice). The sessions ignore REQUESTS_CA_BUNDLE and proxy variables
(requests would let them override the CA). Anything etcd refuses for who this process is (no or
a foreign certificate, a server certificate FABRIC_ETCD_CA does not verify, a wrong password, a
role without the key) raises StoreAccessDenied saying which setting to look at.
"""

from __future__ import annotations

import base64
import builtins
import contextlib
import http.client
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import etcd3gw
import requests
import urllib3
from etcd3gw import exceptions as etcd_exc

from common.errors import Conflict, NotFound, StoreAccessDenied, TransientError
from common.store.base import KV, MAX_TXN_OPS, Changes, Event, Lease, below_nothing, check_range
from common.store.etcd_access import EtcdAccess

REQUEST_TIMEOUT_S = 10.0
FOLLOW_IDLE_S = 1.0  # Store.follow: an idle stream is opened again this often (stop is seen then)
# The key range() reads to learn the store revision: any key works, a fixed absent one is cheapest.
_REVISION_PROBE_KEY = "/fabric/.revision-probe"


def _b64(text: str) -> str:
    return base64.b64encode(text.encode("utf-8")).decode("ascii")


def _unb64(data: str | None) -> str:
    return base64.b64decode(data or "").decode("utf-8")


def _range_end(prefix: str) -> str:
    """etcd's range_end for a prefix: the prefix with its last byte incremented ("\\0" = all keys)."""
    raw = bytearray(prefix.encode("utf-8"))
    while raw:
        if raw[-1] < 0xFF:
            raw[-1] += 1
            return base64.b64encode(bytes(raw)).decode("ascii")
        raw.pop()
    return base64.b64encode(b"\0").decode("ascii")


def _range_request(prefix: str) -> dict[str, Any]:
    key = prefix if prefix else "\0"
    return {"key": _b64(key), "range_end": _range_end(prefix)}


def _kv(item: dict[str, Any]) -> KV:
    lease = int(item.get("lease", 0))
    return KV(
        key=_unb64(item["key"]),
        value=_unb64(item.get("value")),
        mod_revision=int(item["mod_revision"]),
        create_revision=int(item["create_revision"]),
        lease=lease or None,
    )


class _WatchCancelled(Exception):
    """etcd cancelled a watch it had created; the argument is its reason."""


class _StreamIdle(Exception):
    """A watch stream's read timed out: nothing came for its read timeout."""


class _TokenExpired(Exception):
    """etcd no longer knows this process's auth token: log in again and resend."""


def _closed_unanswered(exc: BaseException) -> bool:
    """True when the server closed the connection without an HTTP answer (what etcd's TLS port
    does to a plain-HTTP request)."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, http.client.RemoteDisconnected):
            return True
        nxt = cause.__context__ or cause.__cause__
        if nxt is None and cause.args and isinstance(cause.args[0], BaseException):
            nxt = cause.args[0]
        if nxt is None and len(cause.args) > 1 and isinstance(cause.args[1], BaseException):
            nxt = cause.args[1]
        cause = nxt
    return False


def _never_sent(exc: BaseException) -> bool:
    """True when etcd3gw's connection error wraps a refused or unopened connection: the request
    never reached etcd, so sending it to another member cannot apply it twice."""
    cause = exc.__context__
    if isinstance(cause, requests.exceptions.ConnectTimeout):
        return True
    if isinstance(cause, requests.exceptions.ConnectionError) and cause.args:
        reason = getattr(cause.args[0], "reason", cause.args[0])
        return isinstance(reason, urllib3.exceptions.NewConnectionError)
    return False


def _tls_refusal(exc: BaseException, where: str, access: EtcdAccess | None) -> str | None:
    """What a TLS failure under etcd3gw's connection error means for the operator, or None."""
    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, requests.exceptions.SSLError):
        cause = cause.__context__ or cause.__cause__
    if cause is None:
        return None
    reason = str(cause)
    if "CERTIFICATE_VERIFY_FAILED" in reason:
        return (f"{where} presented a server certificate that FABRIC_ETCD_CA does not verify "
                f"({reason.rsplit('certificate verify failed:', 1)[-1].split('(')[0].strip()})")
    if "WRONG_VERSION_NUMBER" in reason or "record layer failure" in reason:
        return f"{where} does not speak TLS (a plain-HTTP etcd?) while FABRIC_ETCD_CA is set"
    # etcd ends the handshake on a missing or untrusted client certificate with an alert, or,
    # depending on timing under TLS 1.3, by closing the connection (an EOF for the client).
    if any(sign in reason for sign in ("BAD_CERTIFICATE", "CERTIFICATE_REQUIRED", "UNKNOWN_CA", "EOF occurred",
                                        "UNEXPECTED_EOF")):
        if access is None or access.cert is None:
            return f"{where} requires a client certificate: set FABRIC_ETCD_CA, FABRIC_ETCD_CERT and FABRIC_ETCD_KEY"
        return (f"{where} refused this process's client certificate (FABRIC_ETCD_CERT={access.cert}): not signed "
                "by a CA in etcd's --trusted-ca-file, or expired")
    return f"TLS with {where} failed: {reason[-200:]}"


def _described(path: str, payload: dict[str, Any]) -> str:
    """The operation and key a refusal is about, for its message: 'kv/put /fabric/auth/x'."""
    key = payload.get("key")
    if key is None and payload.get("compare"):
        key = payload["compare"][0].get("key")
    return f"{path.strip('/')} {_unb64(key)}" if key else path.strip("/")


class EtcdStore:
    """Store backend on an etcd v3 cluster (3.4+) reached over its HTTP/JSON gateway."""

    def __init__(self, host: str, port: int, *, timeout: float = REQUEST_TIMEOUT_S,
                 endpoints: list[tuple[str, int]] | None = None, access: EtcdAccess | None = None):
        self._endpoints = list(endpoints or [(host, port)])
        self._timeout = timeout
        self._access = access
        self._token: str | None = None
        # api_path fixed to /v3/ (etcd >= 3.4) so no discovery round trip happens at first use.
        self._clients = [etcd3gw.client(host=h, port=p, timeout=timeout, api_path="/v3/",
                                        protocol="https" if access and access.tls else "http",
                                        session=self._new_session())
                         for h, p in self._endpoints]
        self._current = 0

    def _new_session(self) -> requests.Session:
        session = requests.Session()
        session.trust_env = False  # else REQUESTS_CA_BUNDLE replaces FABRIC_ETCD_CA, proxies apply
        access = self._access
        if access is not None and access.tls:
            session.verify = str(access.ca)
            if access.cert is not None and access.key is not None:
                session.cert = (str(access.cert), str(access.key))
        if self._token:
            session.headers["Authorization"] = self._token
        return session

    @property
    def host(self) -> str:
        return self._endpoints[self._current][0]

    @property
    def port(self) -> int:
        return self._endpoints[self._current][1]

    @property
    def _client(self):
        return self._clients[self._current]

    def _where(self) -> str:
        return f"etcd at {self.host}:{self.port}"

    def _advance(self) -> None:
        self._current = (self._current + 1) % len(self._clients)

    # -- transport ----------------------------------------------------------------------

    def _post(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        if self._access is not None and self._access.user and self._token is None:
            self._login()
        try:
            return self._send(path, payload)
        except _TokenExpired:
            self._login()
            return self._send(path, payload)

    def auth_call(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        """One call of etcd's /v3/auth/ API (users, roles, enable), for common.store.etcd_auth."""
        if not path.startswith("/auth/"):
            raise ValueError(f"auth_call is for /auth/ paths, not {path}")
        return self._post(path, payload)

    def _login(self) -> None:
        """Authenticate as FABRIC_ETCD_USER and put the token on every endpoint's session."""
        assert self._access is not None
        for client in self._clients:
            client.session.headers.pop("Authorization", None)
        self._token = None
        result = self._send("/auth/authenticate", {"name": self._access.user, "password": self._access.password})
        self._token = str(result["token"])
        for client in self._clients:
            client.session.headers["Authorization"] = self._token

    def _send(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        for attempt in range(len(self._clients)):
            client, where = self._client, self._where()
            try:
                return client.post(client.get_url(path), json=payload)
            except (etcd_exc.ConnectionFailedError, etcd_exc.ConnectionTimeoutError) as exc:
                self._advance()
                refusal = _tls_refusal(exc, where, self._access)
                if refusal:
                    raise StoreAccessDenied(refusal) from None
                never_sent = _never_sent(exc)
                if never_sent and attempt + 1 < len(self._clients):
                    continue
                what = "unreachable" if never_sent else "did not answer in time (no quorum or overloaded?)"
                if _closed_unanswered(exc) and not (self._access and self._access.tls):
                    what = ("closed the connection without an answer (an etcd serving TLS? set FABRIC_ETCD_CA, "
                            "FABRIC_ETCD_CERT and FABRIC_ETCD_KEY)")
                raise TransientError(f"{where} {what}{self._cluster_note()}") from exc
            except etcd_exc.Etcd3Exception as exc:
                detail = str(exc.detail_text or "")
                if "lease not found" in detail:
                    raise NotFound("lease not found (expired or revoked)") from exc
                if "compacted" in detail:
                    raise Conflict("requested revision was compacted", code="compacted") from exc
                if "invalid auth token" in detail or "revision of auth store is old" in detail:
                    if path != "/auth/authenticate" and self._token is not None:
                        raise _TokenExpired() from None
                refusal = self._refusal(detail, where, path, payload)
                if refusal:
                    raise StoreAccessDenied(refusal) from None
                self._advance()
                raise TransientError(f"{where} failed: {detail[:200]}{self._cluster_note()}") from exc
            except requests.RequestException as exc:
                self._advance()
                raise TransientError(f"{where} unreachable{self._cluster_note()}") from exc
        raise AssertionError("unreachable: the last attempt raises")

    def _refusal(self, detail: str, where: str, path: str, payload: dict[str, Any]) -> str | None:
        """What an etcd answer refusing this process means, or None for any other failure."""
        user = self._access.user if self._access else ""
        if "permission denied" in detail:
            return f"{where}: etcd user {user!r} may not {_described(path, payload)} (its role lacks that key)"
        if "invalid user ID or password" in detail:
            return f"{where} refused the password of etcd user {user!r} (FABRIC_ETCD_PASSWORD_FILE)"
        if "user name is empty" in detail or "invalid auth token" in detail:
            return (f"{where} has authentication on and this process has no login: set FABRIC_ETCD_USER and "
                    "FABRIC_ETCD_PASSWORD_FILE")
        if "HTTP request to an HTTPS server" in detail:
            return f"{where} speaks TLS: set FABRIC_ETCD_CA, FABRIC_ETCD_CERT and FABRIC_ETCD_KEY"
        if "CommonName of client" in detail:
            return (f"{where} refuses a client certificate with a CN once its auth is on (FABRIC_ETCD_CERT): "
                    "issue one with `fabricd store issue-client`")
        return None

    def _cluster_note(self) -> str:
        if len(self._endpoints) == 1:
            return ""
        return f" (store: etcd cluster of {len(self._endpoints)} endpoints)"

    def _txn(self, compare: dict[str, Any], success: dict[str, Any]) -> dict[str, Any]:
        return self._post("/kv/txn", {"compare": [compare], "success": [success], "failure": []})

    # -- reads --------------------------------------------------------------------------

    def get(self, key: str) -> KV | None:
        result = self._post("/kv/range", {"key": _b64(key)})
        kvs = result.get("kvs") or []
        return _kv(kvs[0]) if kvs else None

    def get_all(self, keys: builtins.list[str]) -> builtins.list[KV | None]:
        out: builtins.list[KV | None] = []
        for i in range(0, len(keys), MAX_TXN_OPS):  # a txn of ranges: one round trip per batch
            result = self._post("/kv/txn", {"compare": [], "failure": [], "success": [
                {"request_range": {"key": _b64(k)}} for k in keys[i:i + MAX_TXN_OPS]]})
            for answer in result.get("responses") or []:
                kvs = (answer.get("response_range") or {}).get("kvs") or []
                out.append(_kv(kvs[0]) if kvs else None)
        if len(out) != len(keys):
            raise TransientError(f"etcd answered {len(out)} of {len(keys)} reads in one transaction")
        return out

    def list(self, prefix: str) -> list[KV]:
        payload = _range_request(prefix) | {"sort_order": "ASCEND", "sort_target": "KEY"}
        return [_kv(item) for item in self._post("/kv/range", payload).get("kvs") or []]

    def revision(self) -> int:
        result = self._post("/kv/range", {"key": _b64(_REVISION_PROBE_KEY), "count_only": True})
        return int(result["header"]["revision"])

    def changed_since(self, prefix: str, after_revision: int, at_revision: int, *,
                      start: str | None = None, end: str | None = None) -> Changes:
        # One Range at at_revision: min_mod_revision filters the kvs etcd returns, never its
        # count (every key in the range at that revision). A member behind the one that gave
        # at_revision refuses it as a future revision: a TransientError, asked again next time.
        if at_revision < 1:
            raise ValueError(f"changed_since at revision {at_revision}: a revision the store has reached (>= 1)")
        check_range(prefix, start, end)
        payload = _range_request(prefix) | {"revision": str(at_revision), "min_mod_revision": str(after_revision + 1),
                                            "sort_order": "ASCEND", "sort_target": "KEY"}
        if start is not None:
            payload["key"] = _b64(start)
        if end is not None:
            payload["range_end"] = _b64(end)
        result = self._post("/kv/range", payload)
        return Changes(at_revision, [_kv(item) for item in result.get("kvs") or []], int(result.get("count", 0)))

    # -- writes -------------------------------------------------------------------------

    @staticmethod
    def _put_request(key: str, value: str, lease: int | None) -> dict[str, Any]:
        put: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
        if lease is not None:
            put["lease"] = str(lease)
        return put

    def put(self, key: str, value: str, *, lease: int | None = None) -> int:
        result = self._post("/kv/put", self._put_request(key, value, lease))
        return int(result["header"]["revision"])

    def create(self, key: str, value: str, *, lease: int | None = None) -> bool:
        result = self._txn(
            {"key": _b64(key), "result": "EQUAL", "target": "CREATE", "create_revision": "0"},
            {"request_put": self._put_request(key, value, lease)},
        )
        return bool(result.get("succeeded", False))

    def create_all(self, items: builtins.list[tuple[str, str]]) -> bool:
        if not items:
            return True
        result = self._post("/kv/txn", {
            "compare": [{"key": _b64(k), "result": "EQUAL", "target": "CREATE", "create_revision": "0"}
                        for k, _ in items],
            "success": [{"request_put": self._put_request(k, v, None)} for k, v in items],
            "failure": [],
        })
        return bool(result.get("succeeded", False))

    def put_all(self, items: builtins.list[tuple[str, str]]) -> int:
        if not items:
            return self.revision()
        rev = 0
        for i in range(0, len(items), MAX_TXN_OPS):  # etcd refuses a txn over --max-txn-ops
            result = self._post("/kv/txn", {"compare": [], "failure": [], "success": [
                {"request_put": self._put_request(k, v, None)} for k, v in items[i:i + MAX_TXN_OPS]]})
            rev = int(result["header"]["revision"])
        return rev

    def cas(self, key: str, value: str, mod_revision: int, *, lease: int | None = None) -> bool:
        # An absent key compares as mod_revision 0 in etcd; the contract says "exists", so refuse 0.
        if mod_revision <= 0:
            return False
        result = self._txn(
            {"key": _b64(key), "result": "EQUAL", "target": "MOD", "mod_revision": str(mod_revision)},
            {"request_put": self._put_request(key, value, lease)},
        )
        return bool(result.get("succeeded", False))

    def delete(self, key: str, *, mod_revision: int | None = None) -> bool:
        if mod_revision is None:
            result = self._post("/kv/deleterange", {"key": _b64(key)})
            return int(result.get("deleted", 0)) > 0
        if mod_revision <= 0:
            return False
        result = self._txn(
            {"key": _b64(key), "result": "EQUAL", "target": "MOD", "mod_revision": str(mod_revision)},
            {"request_delete_range": {"key": _b64(key)}},
        )
        if not result.get("succeeded", False):
            return False
        deleted = result["responses"][0].get("response_delete_range", {}).get("deleted", 0)
        return int(deleted) > 0

    def delete_prefix(self, prefix: str, *, below: str | None = None) -> int:
        request = _range_request(prefix)
        if below is not None:
            if below_nothing(prefix, below):
                return 0
            request["range_end"] = _b64(below)  # [prefix, below): inside the prefix's range
        result = self._post("/kv/deleterange", request)
        return int(result.get("deleted", 0))

    # -- leases -------------------------------------------------------------------------

    def grant_lease(self, ttl: int) -> Lease:
        # etcd may raise a small TTL to its minimum; callers read the granted one from Lease.ttl.
        result = self._post("/lease/grant", {"TTL": str(max(1, int(ttl))), "ID": "0"})
        return Lease(id=int(result["ID"]), ttl=int(result["TTL"]))

    def refresh_lease(self, lease_id: int) -> bool:
        try:
            result = self._post("/lease/keepalive", {"ID": str(lease_id)})
        except NotFound:
            return False
        # An expired lease answers with TTL 0, which the JSON gateway omits.
        return int(result.get("result", {}).get("TTL", 0)) > 0

    def revoke_lease(self, lease_id: int) -> None:
        try:
            self._post("/kv/lease/revoke", {"ID": str(lease_id)})
        except NotFound:
            pass  # already expired or revoked: the goal (its keys gone) holds

    # -- watch --------------------------------------------------------------------------

    def watch(self, prefix: str, after_revision: int, timeout: float) -> builtins.list[Event]:
        try:
            return self._watch_once(prefix, after_revision, timeout)
        except _TokenExpired:
            self._login()
            return self._watch_once(prefix, after_revision, timeout)

    def _watch_once(self, prefix: str, after_revision: int, timeout: float) -> builtins.list[Event]:
        try:
            with self._watch_stream(prefix, after_revision, max(0.05, timeout)) as resp:
                # counted from the open stream, not the connect: history already there (sent right
                # after the "created" answer) is returned even with a short timeout
                return _read_first_events(resp, time.monotonic() + max(0.0, timeout))
        except _StreamIdle:
            return []

    def follow(self, prefix: str, after_revision: int, stop: threading.Event) -> Iterator[builtins.list[Event]]:
        """One watch stream kept open while events come (Store.follow); idle for FOLLOW_IDLE_S,
        it is opened again from the last revision yielded, so ``stop`` is seen that often."""
        after = after_revision
        while not stop.is_set():
            try:
                with self._watch_stream(prefix, after, FOLLOW_IDLE_S) as resp:
                    for events in _stream_events(resp):
                        after = events[-1].revision
                        yield events
                        if stop.is_set():
                            return
            except _StreamIdle:
                continue
            except _TokenExpired:
                self._login()

    @contextlib.contextmanager
    def _watch_stream(self, prefix: str, after_revision: int, read_timeout: float) -> Iterator[requests.Response]:
        """An open watch stream of the prefix from after_revision + 1; its reads wait read_timeout.
        A read that times out is _StreamIdle; etcd's refusals and failures are the Store's errors."""
        if self._access is not None and self._access.user and self._token is None:
            self._login()
        create = _range_request(prefix) | {"start_revision": str(after_revision + 1)}
        url, where = self._client.get_url("/watch"), self._where()
        try:
            with self._new_session() as session, session.post(
                url, json={"create_request": create}, stream=True, timeout=(self._timeout, read_timeout),
            ) as resp:
                if resp.status_code == 401 and self._token is not None:
                    raise _TokenExpired()
                if resp.status_code != 200:
                    self._advance()
                    refusal = self._refusal(resp.text[:500], where, "watch", create)
                    if refusal:
                        raise StoreAccessDenied(refusal)
                    raise TransientError(f"{where}: watch failed with HTTP {resp.status_code}")
                yield resp
        except _WatchCancelled as exc:
            refusal = self._refusal(str(exc), where, "watch", create)
            if refusal:
                raise StoreAccessDenied(refusal) from None
            raise TransientError(f"etcd cancelled the watch: {str(exc)[:200]}") from None
        except requests.exceptions.ConnectionError as exc:
            # A read timeout on a streamed body surfaces as ConnectionError wrapping ReadTimeoutError.
            if exc.args and isinstance(exc.args[0], urllib3.exceptions.ReadTimeoutError):
                raise _StreamIdle() from None
            self._advance()
            refusal = _tls_refusal(exc, where, self._access)
            if refusal:
                raise StoreAccessDenied(refusal) from None
            raise TransientError(f"{where} unreachable{self._cluster_note()}") from exc
        except requests.exceptions.Timeout:
            raise _StreamIdle() from None

    def close(self) -> None:
        for client in self._clients:
            client.session.close()


def _read_first_events(resp: requests.Response, deadline: float) -> list[Event]:
    """Read watch-stream messages until one carries events or the deadline passes. A message
    begun by the deadline is read to its end (each read still bounded by the read timeout):
    its events are answered, not dropped with the half already read."""
    for events in _stream_events(resp, deadline):
        if events:
            return events
        if time.monotonic() >= deadline:
            return []
    return []


def _stream_events(resp: requests.Response, deadline: float | None = None) -> Iterator[list[Event]]:
    """Each watch-stream message's events, in order (etcd keeps a revision's events in one
    message); with a deadline, also an empty list whenever a read ends with no message begun,
    so the caller can stop. A cancelled watch raises: Conflict("compacted") when the history
    asked for is gone, _WatchCancelled otherwise."""
    buffer = b""
    for chunk in resp.iter_content(chunk_size=None):
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            if not line.strip():
                continue
            result = json.loads(line).get("result", {})
            if result.get("canceled"):
                compact = int(result.get("compact_revision", 0))
                if compact:
                    raise Conflict(
                        f"watch history before revision {compact} was compacted;"
                        " list again and watch from the list's revision",
                        code="compacted",
                    )
                raise _WatchCancelled(result.get("cancel_reason", ""))
            events = result.get("events") or []
            if events:
                yield [_event(e) for e in events]
        if deadline is not None and not buffer.strip():
            yield []


def _event(raw: dict[str, Any]) -> Event:
    kv = raw["kv"]
    deleted = raw.get("type") == "DELETE"
    return Event(
        type="delete" if deleted else "put",
        key=_unb64(kv["key"]),
        value=None if deleted else _unb64(kv.get("value")),
        revision=int(kv["mod_revision"]),
        create_revision=0 if deleted else int(kv.get("create_revision", 0)),
    )
