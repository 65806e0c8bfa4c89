"""Request limits: the pure part decides which counters a call needs; the applier reserves them.

plan_admission(settings, facts) -> list[Reservation] names every counter to take, with its
limit. admit() takes them in order from the store (common.records.counters: exact under several
processes) and, if one refuses, gives back the ones already taken and raises LimitExceeded
with Retry-After. After the call, settle() corrects token windows from the estimate to the real
usage and release() frees in-flight slots (streams, max_concurrent) -- the caller runs both in a
finally so a client that leaves frees its slot.

Only configured limits produce reservations, so an unlimited key costs no store round trip.
Within one process, operations on one counter are serialised by an asyncio lock so the store's
compare-and-swap only ever races with other processes.

In-flight slots (streams, a key's max_concurrent) are held counters under this process's lease
(gateway.slots), so a gateway that dies gives them back within the lease TTL. Windows (RPM, TPM,
daily tokens) are written under a shared lease that outlives the window, so a counter named by a
caller (x-user-id, x-project-id, a model) disappears once unused. A refusal names the limit and
its configured value, never the fleet-wide count.

USER and PROJECT values are whatever the caller writes in x-user-id and x-project-id, so their
counters are namespaced by the caller's tenant (or, without one, its credential):
``rpm/user/t-{tenant}/{user}``. They share a tenant's allowance fairly among the names its own
callers give; they cannot bound a caller that invents a fresh name per call (the key, TENANT
and GLOBAL limits do that), and no caller can spend another tenant's.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from common import keyspace
from common.errors import LimitExceeded, NotFound
from common.records import counters
from common.store.base import Store
from gateway.openai_errors import RequestTooLarge
from gateway.ratelimit_headers import headers_for
from gateway.settings import GatewaySettings
from gateway.slots import SlotHolder
from gateway.usage import UsageCounter, usage_key

MINUTE = 60
DAY = 86400
# What a key's own limits are called in refusals, shadow lists and audit rows (ApiKeyRecord.shadow_limits
# names them by field: request_quota, tokens_per_minute, max_concurrent).
KEY_LIMITS = {"request_quota": "the API key's request quota", "max_concurrent": "the API key's max_concurrent",
              "tokens_per_minute": "the API key's tokens_per_minute"}


def key_shadowed(names) -> frozenset[str]:
    """A key's ``shadow_limits`` as limit names: its own limits by field (request_quota,
    tokens_per_minute, max_concurrent), gateway-wide ones as FABRIC_<LIMIT> (FABRIC_TENANT_TPM...)."""
    return frozenset(KEY_LIMITS.get(n, n) for n in names or ())


@dataclass(frozen=True)
class RequestFacts:
    endpoint: str
    model: str
    tenant: str | None
    project: str | None
    user: str | None
    gateway_id: str
    prompt_chars: int
    max_tokens: int | None
    key_id: str | None = None
    request_quota: int | None = None
    key_tokens_per_minute: int | None = None
    key_max_concurrent: int | None = None
    choices: int = 1  # n / best_of: each sequence may generate max_tokens
    caller: str | None = None  # the credential's subject (a key id, a JWT's sub)

    @property
    def namespace(self) -> str:
        """Whose names x-user-id and x-project-id are: the tenant's, else the one credential's.
        Another tenant's caller naming the same user counts on a counter of its own."""
        if self.tenant is not None:
            return "t-" + key_part(self.tenant)
        return "c-" + key_part(self.caller or self.key_id or "anonymous")

    @property
    def prompt_tokens(self) -> int:
        return (self.prompt_chars + 3) // 4

    @property
    def token_estimate(self) -> int:
        return self.prompt_tokens + (self.max_tokens or 0) * self.choices


@dataclass(frozen=True)
class Reservation:
    key: str
    amount: int
    limit: int | None  # None: counted, never refused
    window_secs: int | None  # None: an exact counter; else a fixed window of that length
    what: str  # names the limit in a refusal; never a secret
    held: bool = False  # an in-flight slot, released when the call ends
    tokens: bool = False  # counts tokens, so settle() corrects it to the real usage


def check_caps(settings: GatewaySettings, facts: RequestFacts, tenant_max_context: int | None = None) -> None:
    """Pure: refuse a request whose prompt, generation or context is over the configured caps
    (the context: FABRIC_MAX_CONTEXT, or the tenant's max_context_tokens when tighter)."""
    if settings.max_prompt_tokens and facts.prompt_tokens > settings.max_prompt_tokens:
        raise RequestTooLarge(
            f"prompt is about {facts.prompt_tokens} tokens; FABRIC_MAX_PROMPT_TOKENS is {settings.max_prompt_tokens}",
            code="prompt_too_long",
        )
    if settings.max_generated_tokens and (facts.max_tokens or 0) > settings.max_generated_tokens:
        raise RequestTooLarge(
            f"max_tokens {facts.max_tokens} is above FABRIC_MAX_GENERATED_TOKENS {settings.max_generated_tokens}",
            code="max_tokens_too_large",
        )
    context = facts.prompt_tokens + (facts.max_tokens or 0)
    if context > settings.max_context:
        raise RequestTooLarge(
            f"prompt plus max_tokens is about {context} tokens; the context limit is {settings.max_context}",
            code="context_length_exceeded",
        )
    if tenant_max_context is not None and context > tenant_max_context:
        raise RequestTooLarge(
            f"prompt plus max_tokens is about {context} tokens; tenant {facts.tenant!r}'s max_context_tokens is "
            f"{tenant_max_context}", code="context_length_exceeded",
        )


_SAFE = re.compile(r"^[A-Za-z0-9._@:+-]{1,128}$")
CALLER_NAMED = ("PROJECT", "USER")  # scopes whose value is a header the caller writes


def key_part(value: str) -> str:
    """A caller-chosen name as one safe key segment (a hash when it is long or odd)."""
    if _SAFE.match(value):
        return value
    return "h-" + hashlib.blake2b(value.encode(), digest_size=12).hexdigest()


def _scopes(facts: RequestFacts) -> dict[str, str | None]:
    # A scope whose value is absent (no tenant on the key, no x-project-id...) does not apply.
    values = {
        "GLOBAL": "all",
        "TENANT": facts.tenant,
        "PROJECT": facts.project,
        "MODEL": facts.model,
        "USER": facts.user,
        "GATEWAY": facts.gateway_id,
    }
    scoped = {k: key_part(v) if v is not None else None for k, v in values.items()}
    for k in CALLER_NAMED:  # the caller's own header: counted within its tenant (or credential)
        if scoped[k] is not None:
            scoped[k] = f"{facts.namespace}/{scoped[k]}"
    return scoped


def _slot(name: str) -> str:
    return counters.held_key(name)


def plan_admission(settings: GatewaySettings, facts: RequestFacts) -> list[Reservation]:
    plan: list[Reservation] = []
    if facts.key_id and facts.request_quota:
        # Every key's requests are counted (fabricctl's USED column); with a quota the count is
        # an exact reservation, without one gateway.usage counts it off the hot path.
        plan.append(Reservation(usage_key(facts.key_id), 1, facts.request_quota, None,
                                KEY_LIMITS["request_quota"]))
    if facts.key_id and facts.key_max_concurrent:
        plan.append(Reservation(_slot(f"inflight/key/{facts.key_id}"), 1, facts.key_max_concurrent,
                                None, KEY_LIMITS["max_concurrent"], held=True))
    if facts.key_id and facts.key_tokens_per_minute:
        plan.append(Reservation(keyspace.counters(f"tpm/key/{facts.key_id}"), facts.token_estimate,
                                facts.key_tokens_per_minute, MINUTE, KEY_LIMITS["tokens_per_minute"],
                                tokens=True))
    scoped = settings.streams or settings.rpm or settings.tpm  # most gateways set none: skip the key names
    for scope, value in (_scopes(facts) if scoped else {}).items():
        if value is None:
            continue
        if scope in settings.streams:
            plan.append(Reservation(_slot(f"streams/{scope.lower()}/{value}"), 1,
                                    settings.streams[scope], None, f"FABRIC_{scope}_STREAMS", held=True))
        if scope in settings.rpm:
            plan.append(Reservation(keyspace.counters(f"rpm/{scope.lower()}/{value}"), 1,
                                    settings.rpm[scope], MINUTE, f"FABRIC_{scope}_RPM"))
        if scope in settings.tpm:
            plan.append(Reservation(keyspace.counters(f"tpm/{scope.lower()}/{value}"), facts.token_estimate,
                                    settings.tpm[scope], MINUTE, f"FABRIC_{scope}_TPM", tokens=True))
    if settings.daily_tokens:
        plan.append(Reservation(keyspace.counters("daily-tokens"), facts.token_estimate, settings.daily_tokens,
                                DAY, "FABRIC_DAILY_TOKENS", tokens=True))
    return plan


def window_of(now: float, window_secs: int | None) -> int:
    """The start of the fixed window ``now`` falls in (common.records.counters' arithmetic); 0: no window."""
    return int(now // window_secs) * window_secs if window_secs else 0


def window_clock(clock_file: str | None) -> Callable[[], float]:
    """The limit windows' clock: the system's, or the time the file FABRIC_GATEWAY_CLOCK_FILE holds,
    read at every call. Tests keep one such file for every gateway they start
    (tests/support/fake_clock.py), so a window ends only when a test moves the time on, never at a
    wall-clock minute in the middle of a check."""
    if clock_file is None:
        return time.time
    path = Path(clock_file)
    return lambda: float(path.read_text())


@dataclass
class Hold:
    """What a call holds of one token counter: ``held`` tokens in the window starting at ``window``,
    for its count from ``base`` on (0 at admission; gateway.live_budget moves both when a stream
    outlives the window)."""

    r: Reservation
    window: int
    held: int
    base: int = 0


@dataclass
class Admission:
    taken: list[Reservation]
    estimate: int
    settled: bool = False
    released: bool = False
    seen: list = field(default_factory=list)  # (reservation, count after it): gateway.ratelimit_headers
    would_refuse: list = field(default_factory=list)  # shadowed limits this call passed (gateway.shadow)
    holds: list[Hold] = field(default_factory=list)  # the token counters' holds (settle, gateway.live_budget)
    shadow: frozenset[str] = frozenset()  # the limits this call only reports (settings' and its key's)
    at: float = 0.0  # when it was admitted, on the windows' clock (the x-ratelimit-reset-* headers)

    @property
    def headers(self) -> list[tuple[bytes, bytes]]:
        return headers_for(self.seen, self.at)


@dataclass
class LimitKeeper:
    """Applies admission plans against the store; one per gateway process."""

    store: Store
    slots: SlotHolder
    usage: UsageCounter | None = None  # counts keys without a quota (their USED), off the hot path
    _locks: dict[str, list] = field(default_factory=dict)  # key -> [lock, users]; dropped when unused
    _window_leases: dict[int, tuple[int, float]] = field(default_factory=dict)  # window -> (lease, use until)
    _lease_lock: threading.Lock = field(default_factory=threading.Lock)
    shadow: frozenset[str] = frozenset()  # counted, never refusing (GatewaySettings.shadow_limits, gateway.shadow)
    clock: Callable[[], float] = time.time  # the windows' clock (window_clock)

    def _window_lease(self, window_secs: int, now: float, renew: bool = False) -> int:
        """A lease of twice the window, used for writes during its first window-length: a key
        written at t covers a window ending by t + window, before the lease expires."""
        with self._lease_lock:
            hit = self._window_leases.get(window_secs)
            if hit is None or now >= hit[1] or renew:
                hit = (self.store.grant_lease(2 * window_secs).id, now + window_secs)
                self._window_leases[window_secs] = hit
            return hit[0]

    def _change(self, r: Reservation, amount: int, limit: int | None, now: float | None = None) -> counters.Outcome:
        if r.held:
            return self.slots.change(r.key, amount, limit)
        if r.window_secs is None:
            return counters.reserve(self.store, r.key, amount, limit)
        now = self.clock() if now is None else now
        lease = self._window_lease(r.window_secs, now)
        try:
            return counters.window_reserve(self.store, r.key, amount, limit, r.window_secs, now, lease)
        except NotFound:  # the lease was revoked or expired under us (a stalled process): a new one
            lease = self._window_lease(r.window_secs, now, renew=True)
            return counters.window_reserve(self.store, r.key, amount, limit, r.window_secs, now, lease)

    async def _apply(self, r: Reservation, amount: int, limit: int | None,
                     now: float | None = None) -> counters.Outcome:
        entry = self._locks.get(r.key)
        if entry is None:
            entry = self._locks[r.key] = [asyncio.Lock(), 0]
        entry[1] += 1
        try:
            async with entry[0]:
                return await asyncio.to_thread(self._change, r, amount, limit, now)
        finally:
            entry[1] -= 1
            if not entry[1]:
                del self._locks[r.key]

    def count_use(self, facts: RequestFacts) -> None:
        """A key without a request quota: count its call in the background (with a quota the
        admission's reservation already counted it)."""
        if facts.key_id and not facts.request_quota and self.usage is not None:
            self.usage.count(facts.key_id)

    async def admit(self, plan: list[Reservation], estimate: int, shadow: frozenset[str] = frozenset()) -> Admission:
        """``shadow``: more limits to only report for this call (its key's shadow_limits)."""
        taken: list[Reservation] = []
        seen: list[tuple[Reservation, int]] = []
        would: list[str] = []
        holds: list[Hold] = []
        shadow = self.shadow | shadow if shadow else self.shadow
        for r in plan:
            if r.tokens and r.window_secs == MINUTE and r.limit is not None and r.amount > r.limit:
                # Waiting cannot help a request bigger than the whole minute's allowance.
                for t in reversed(taken):
                    await self._apply(t, -t.amount, None)
                raise RequestTooLarge(f"this request alone needs about {r.amount} tokens (prompt estimate plus "
                                      f"max_tokens), more than {r.what} allows in a minute ({r.limit}): it can "
                                      "never fit; shorten the prompt or lower max_tokens", code="request_too_large")
            now = self.clock()
            if r.what in shadow:  # counted as usual; a refusal is only reported
                outcome = await self._apply(r, r.amount, None, now)
                if r.limit is not None and outcome.value > r.limit:
                    would.append(r.what)
            else:
                outcome = await self._apply(r, r.amount, r.limit, now)
            if not outcome.ok:
                for t in reversed(taken):
                    await self._apply(t, -t.amount, None)
                retry = outcome.retry_after or 1.0
                exc = LimitExceeded(f"{r.what} ({r.limit}) is reached; try again later", retry_after=retry,
                                    code="quota_exceeded" if "quota" in r.what else "rate_limited")
                exc.headers = headers_for([(r, r.limit)], now)
                raise exc
            taken.append(r)
            seen.append((r, outcome.value))
            if r.tokens:
                holds.append(Hold(r, window_of(now, r.window_secs), r.amount))
        return Admission(taken, estimate, seen=seen, would_refuse=would, holds=holds, shadow=shadow,
                         at=self.clock())

    async def settle(self, admission: Admission, tokens: int) -> None:
        """Replace what the call holds with its real count in every token window. In the window
        it holds in, the difference is applied (unused tokens given back); once that window has
        passed, only tokens beyond what it held are charged to the current one, so a call that
        outlived its window never gives back tokens other calls took in the new one."""
        if admission.settled:
            return
        admission.settled = True
        now = self.clock()
        for h in admission.holds:
            delta = tokens - h.base - h.held
            if window_of(now, h.r.window_secs) != h.window:
                delta = max(0, delta)
            if delta:
                await self._apply(h.r, delta, None, now)

    async def release(self, admission: Admission) -> None:
        if admission.released:
            return
        admission.released = True
        for r in admission.taken:
            if r.held:
                await self._apply(r, -r.amount, None)
