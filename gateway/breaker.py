"""One circuit breaker per external provider key (pure: state in, state out).

- closed: the key is used.
- 429 or 5xx: open for a cooldown (1 s doubling per consecutive failure, at most 60 s; a longer
  Retry-After from the provider wins, up to 300 s). Connect failures count as 5xx.
- open past its cooldown: half_open; one call may try the key (the others pass it over). The
  trial's success closes it; another failure opens it again with the doubled cooldown.
- 401: refused -- the provider does not accept the key; it is passed over until its key file
  changes (a rotated key starts closed again). The refusal is reported by the key's index and
  file name, never its text.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

BASE_COOLDOWN = 1.0
MAX_COOLDOWN = 60.0
MAX_RETRY_AFTER = 300.0


@dataclass(frozen=True)
class Breaker:
    state: str = "closed"  # closed | open | half_open | refused
    failures: int = 0
    open_until: float = 0.0
    trial: bool = False  # half_open: a trial call is in flight


def usable(b: Breaker, now: float) -> tuple[bool, Breaker]:
    """May a call use this key now? Returns the state to keep (open -> half_open with its trial
    taken when the cooldown has passed)."""
    if b.state == "closed":
        return True, b
    if b.state == "open" and now >= b.open_until:
        return True, replace(b, state="half_open", trial=True)
    if b.state == "half_open" and not b.trial:
        return True, replace(b, trial=True)
    return False, b


def after(b: Breaker, status: int, now: float, retry_after: float | None = None) -> Breaker:
    """The state after a call that used the key answered ``status`` (0: could not connect)."""
    if status == 401:
        return Breaker(state="refused")
    if status == 429 or status >= 500 or status == 0:
        failures = b.failures + 1
        cooldown = min(MAX_COOLDOWN, BASE_COOLDOWN * 2 ** (failures - 1))
        if retry_after is not None:
            cooldown = max(cooldown, min(MAX_RETRY_AFTER, retry_after))
        return Breaker(state="open", failures=failures, open_until=now + cooldown)
    return Breaker()  # any other answer: the key works


def retry_after_secs(value: bytes | None) -> float | None:
    """A provider's Retry-After in seconds (HTTP dates are ignored: the doubling applies)."""
    if not value:
        return None
    try:
        secs = float(value.decode("latin-1").strip())
    except ValueError:
        return None
    return secs if secs >= 0 else None
