"""OpenAI's rate-limit headers on the gateway's answers, from the admission's own reservations
(no extra store read):

  x-ratelimit-limit-requests / -remaining-requests / -reset-requests
  x-ratelimit-limit-tokens   / -remaining-tokens   / -reset-tokens

"requests" is the call's tightest request limit (a FABRIC_<SCOPE>_RPM window, or the key's
request quota, which has no reset), "tokens" its tightest token window (a key's or scope's TPM,
FABRIC_DAILY_TOKENS). Remaining is what the limit leaves after this call's reservation (tokens:
after its estimate, prompt plus max_tokens, as admission reserved it). Resets are the time to
the end of the fixed window in OpenAI's duration format ("1m30s", "59s"). A 429 carries the
headers of the limit that refused it, remaining 0. A call under no such limit gets none.
"""

from __future__ import annotations

MINUTE = 60


def duration(seconds: float) -> str:
    """OpenAI's reset format: 6m0s, 1s, 1h2m3s (whole seconds, at least 1s)."""
    s = max(1, int(-(-seconds // 1)))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    out = (f"{h}h" if h else "") + (f"{m}m" if h or m else "") + f"{sec}s"
    return out


def _reset(window_secs: int | None, now: float) -> str | None:
    if not window_secs:
        return None
    return duration(window_secs - now % window_secs)


def headers_for(seen: list[tuple[object, int]], now: float) -> list[tuple[bytes, bytes]]:
    """``seen``: (reservation, the counter's value after it) for each limit the call passed or
    hit (gateway.limits.Reservation: limit, window_secs, tokens, held); ``now`` on the windows'
    clock (gateway.limits.LimitKeeper.clock)."""
    best: dict[str, tuple[int, int, int | None]] = {}  # kind -> (remaining, limit, window)
    for r, value in seen:
        if r.limit is None or r.held:
            continue
        kind = "tokens" if r.tokens else "requests"
        remaining = max(0, r.limit - value)
        if kind not in best or remaining < best[kind][0]:
            best[kind] = (remaining, r.limit, r.window_secs)
    out: list[tuple[bytes, bytes]] = []
    for kind in ("requests", "tokens"):
        if kind not in best:
            continue
        remaining, limit, window = best[kind]
        out.append((f"x-ratelimit-limit-{kind}".encode(), str(limit).encode()))
        out.append((f"x-ratelimit-remaining-{kind}".encode(), str(remaining).encode()))
        reset = _reset(window, now)
        if reset is not None:
            out.append((f"x-ratelimit-reset-{kind}".encode(), reset.encode()))
    return out
