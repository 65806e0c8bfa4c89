"""Endpoints served by an OpenAI-compatible API outside the cluster (``external``).

The call's model is rewritten to the provider's model name, the caller's credential (already
dropped by proxy.upstream_headers) is replaced by one of the endpoint's provider keys, and the
path below ``/v1`` is appended to the provider's URL. Keys:

- each is a file on the gateway host, stat'ed at most once a second and re-read when it changes
  (rotation: write the new key into the file); a changed key starts with a fresh breaker. A file
  that is missing, empty, over 8 KiB or holds anything but printable ASCII is not used, nor one
  whose real path is outside FABRIC_PROVIDER_KEY_DIR: whoever may create an endpoint names the
  file and the URL its content is sent to, so only that directory's files can ever leave.
- a key is drawn by weight among those whose breaker lets a call through (gateway.breaker);
  429, 5xx and connect failures open its breaker, 401 marks it refused, and the call moves to the
  next usable key before any byte reached the client. Which key was refused is reported by its
  index to callers (answer, explain, metric label ``key``) and with its file name in the log
  only; never by its text.
- when no key is usable the call is answered 503 ``provider_unavailable`` with Retry-After.

Calls leave with Fabric's own HTTP/1.1 client, in a pool of its own verified against the
system's trust store (never the cluster CA the replicas use).
"""

from __future__ import annotations

import logging
import os
import random
import time
from dataclasses import dataclass, field

from common.errors import LimitExceeded, NotFound
from common.http1_client import UpstreamError, UpstreamPool, UpstreamTimeoutError
from common.schemas import ExternalProvider, InferenceEndpoint
from gateway import breaker
from gateway.provider_headers import RESPONSE_ALLOWED, provider_headers
from gateway.proxy import ProxyResult, UpstreamTimeout, relay
from gateway.request_body import with_field

log = logging.getLogger("fabric.gateway.external")
MAX_KEY_BYTES = 8192
STAT_EVERY = 1.0
STATE_VALUE = {"closed": 0, "half_open": 1, "open": 2, "refused": 3}


class ProviderUnavailable(LimitExceeded):
    """503 with Retry-After: every key of the provider is open, refused or unreadable."""

    status = 503
    code = "provider_unavailable"


def split_url(url: str) -> tuple[str, str, int, bytes]:
    """'https://host[:port]/base' -> (scheme, host, port, b'/base')."""
    scheme, _, rest = url.partition("://")
    hostport, slash, path = rest.partition("/")
    host, colon, port = hostport.rpartition(":") if hostport.rfind(":") > hostport.rfind("]") else (hostport, "", "")
    default = 443 if scheme == "https" else 80
    return scheme, host.strip("[]"), int(port) if colon else default, (slash + path).rstrip("/").encode()


def provider_path(base: bytes, target: bytes) -> bytes | None:
    """The provider's path: its base URL's path plus what follows /v1 in the call's path; None
    for a path outside /v1/ (only the OpenAI API is forwarded, never another path of the host)."""
    return base + target[3:] if target.startswith(b"/v1/") else None


def inside(path: str, root: str) -> bool:
    """Whether path's real path (symlinks resolved) is under root's."""
    real, base = os.path.realpath(path), os.path.realpath(root)
    return os.path.commonpath([real, base]) == base and real != base


def _read_key(path: str, root: str) -> str | None:
    if not inside(path, root):
        return None
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_KEY_BYTES + 1)
    except OSError:
        return None
    text = raw.strip()
    if not text or len(raw) > MAX_KEY_BYTES or any(b < 0x21 or b > 0x7E for b in text):
        return None
    return text.decode("ascii")


@dataclass
class _Key:
    file: str
    weight: int
    root: str
    text: str | None = None
    stamp: tuple | None = None
    checked: float = -1e18
    breaker: breaker.Breaker = field(default_factory=breaker.Breaker)

    def refresh(self, now: float) -> None:
        if now - self.checked < STAT_EVERY:
            return
        self.checked = now
        try:
            st = os.stat(self.file)
            stamp: tuple | None = (st.st_ino, st.st_mtime_ns, st.st_size)
        except OSError:
            stamp = None
        if stamp != self.stamp:
            self.stamp, self.text, self.breaker = stamp, _read_key(self.file, self.root) if stamp else None, \
                breaker.Breaker()


@dataclass
class KeyRing:
    keys: list[_Key]
    spec: tuple

    @classmethod
    def of(cls, provider: ExternalProvider, root: str) -> KeyRing:
        return cls([_Key(k.file, k.weight, root) for k in provider.keys],
                   tuple((k.file, k.weight) for k in provider.keys))

    def label(self, i: int) -> str:
        """How a key is named to callers (answers, explain): its index only, never its file."""
        return f"#{i}"

    def log_label(self, i: int) -> str:
        """How a key is named in the gateway's own log: its index and file name."""
        return f"#{i} ({os.path.basename(self.keys[i].file)})"

    def pick(self, now: float, exclude: set[int], rng: random.Random) -> int | None:
        """A usable key by weight (its breaker moves to half_open when this is its trial)."""
        for k in self.keys:
            k.refresh(now)
        usable = []
        for i, k in enumerate(self.keys):
            if i in exclude or k.text is None:
                continue
            ok, _ = breaker.usable(k.breaker, now)
            if ok:
                usable.append(i)
        if not usable:
            return None
        i = rng.choices(usable, weights=[self.keys[j].weight for j in usable])[0]
        self.keys[i].breaker = breaker.usable(self.keys[i].breaker, now)[1]
        return i

    def result(self, i: int, status: int, now: float, retry_after: float | None = None) -> None:
        self.keys[i].breaker = breaker.after(self.keys[i].breaker, status, now, retry_after)

    def abandon(self, i: int) -> None:
        """The call ended with no answer (cancelled): a half_open trial may be taken again."""
        b = self.keys[i].breaker
        if b.state == "half_open":
            self.keys[i].breaker = breaker.Breaker("open", b.failures, 0.0)

    def states(self) -> list[dict]:
        return [{"key": self.label(i), "state": "unreadable" if k.text is None else k.breaker.state}
                for i, k in enumerate(self.keys)]

    def retry_after(self, now: float) -> float:
        opens = [k.breaker.open_until - now for k in self.keys if k.text and k.breaker.state == "open"]
        return max(1.0, min(opens)) if opens else 30.0


@dataclass
class ExternalRouter:
    """Per gateway process: the key rings of external endpoints and their client pool."""

    idle_secs: float = 60.0
    key_dir: str = "/etc/fabric/provider-keys"  # FABRIC_PROVIDER_KEY_DIR: key files are read only here
    on_key_state: object = None  # callable(endpoint, key index, state) for the metric
    _rings: dict[str, KeyRing] = field(default_factory=dict)
    _pool: UpstreamPool | None = None
    _rng: random.Random = field(default_factory=random.Random)

    def ring(self, ep: InferenceEndpoint) -> KeyRing:
        prov = ep.external
        ring = self._rings.get(ep.name)
        spec = tuple((k.file, k.weight) for k in prov.keys)
        if ring is None or ring.spec != spec:
            ring = self._rings[ep.name] = KeyRing.of(prov, self.key_dir)
        return ring

    @property
    def pool(self) -> UpstreamPool:
        if self._pool is None:
            self._pool = UpstreamPool(None, connect_timeout=5.0, idle_timeout=self.idle_secs)
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()

    def _report(self, ep: str, ring: KeyRing, i: int) -> None:
        if self.on_key_state is not None:
            self.on_key_state(ep, i, STATE_VALUE.get(ring.keys[i].breaker.state, 0))

    async def forward(self, send, ep: InferenceEndpoint, method: str, target: bytes, headers: list, body: bytes,
                      data: dict | None, notes: dict, extra: list | None = None) -> ProxyResult:
        prov = ep.external
        ring = self.ring(ep)
        scheme, host, port, base = split_url(prov.url)
        path = provider_path(base, target)
        if path is None:
            raise NotFound("an external endpoint serves only /v1/... paths", code="not_found")
        if data is not None and "model" in data and data.get("model") != prov.model:
            body = with_field(body, data, "model", prov.model)
        notes["provider_model"] = prov.model
        headers = provider_headers(headers)  # an allow-list leaves the cluster, never the caller's identity
        tried: set[int] = set()
        t0 = time.perf_counter()
        while (i := ring.pick(time.monotonic(), tried, self._rng)) is not None:
            tried.add(i)
            auth = [(b"authorization", b"Bearer " + ring.keys[i].text.encode())]
            try:
                resp = await self.pool.request(scheme, host, port, method, path, headers + auth, body)
            except UpstreamTimeoutError:
                ring.result(i, 0, time.monotonic())
                self._report(ep.name, ring, i)
                raise UpstreamTimeout("the external provider did not answer in time") from None
            except UpstreamError:
                ring.result(i, 0, time.monotonic())
                self._report(ep.name, ring, i)
                notes.setdefault("keys_failed", []).append(ring.label(i))
                continue
            except BaseException:
                ring.abandon(i)
                raise
            status = resp.status
            ring.result(i, status, time.monotonic(), breaker.retry_after_secs(resp.header(b"retry-after")))
            self._report(ep.name, ring, i)
            if status == 401:
                notes.setdefault("keys_refused", []).append(ring.label(i))
                log.warning("external endpoint %s refused its key %s (401); passed over until the file changes",
                            ep.name, ring.log_label(i))
                resp.close()
                continue
            if status == 429 or status >= 500:
                notes.setdefault("keys_failed", []).append(ring.label(i))
                resp.close()
                continue
            notes["key"] = ring.label(i)
            return await relay(resp, send, t0, extra, allow=RESPONSE_ALLOWED)  # never the account's headers
        notes["keys"] = ring.states()
        raise ProviderUnavailable(f"no key of external endpoint {ep.name!r} is usable now "
                                  f"({', '.join(k['key'] + ' ' + k['state'] for k in notes['keys'])})",
                                  retry_after=ring.retry_after(time.monotonic()))
