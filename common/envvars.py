"""Reading FABRIC_* numbers from the environment with an error that names the variable.

    number(env, "FABRIC_RECONCILE_SECS", 15.0)          -> float, default when unset or empty
    number(env, "FABRIC_LEADER_TTL_SECS", 15, int)      -> int

A value that is not a number, or is negative, raises EnvError("FABRIC_X='abc' is not a number"),
so a process refuses to start naming what to fix instead of failing later in a thread.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping


class EnvError(ValueError):
    """A FABRIC_* variable with a value the process cannot use; the message names it."""


def number(env: Mapping[str, str], name: str, default: float, cast: Callable[[str], float] = float) -> float:
    raw = (env.get(name) or "").strip()
    if not raw:
        return default
    try:
        value = cast(raw)
    except ValueError:
        what = "an integer" if cast is int else "a number"
        raise EnvError(f"{name}={raw!r} is not {what}") from None
    if value < 0:
        raise EnvError(f"{name}={raw!r} must not be negative")
    return value
