"""Node-wide dataplane settings the agent writes into the config map at attach.

Nothing else writes them: a process that merely opens the pinned maps (the
CLI, a test) never changes node_ip or the flow timeouts of a running node.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from common.errors import InvalidInput

UDP_FLOW_SECS = 30  # FABRIC_UDP_FLOW_SECS: a UDP flow silent this long is picked again
MISS_INSERTS = 10000  # FABRIC_MISS_INSERTS: non-SYN misses recorded per CPU per second
# FABRIC_XDP_FORWARD: translated packets leave by fib lookup + redirect (1, default) or
# through the kernel stack (0: slower, for comparison or a device that drops XDP frames)
XDP_FORWARD = True


@dataclass(frozen=True)
class DataplaneSettings:
    udp_flow_secs: int = UDP_FLOW_SECS
    miss_inserts: int = MISS_INSERTS
    xdp_forward: bool = XDP_FORWARD

    def __post_init__(self) -> None:
        if not isinstance(self.xdp_forward, bool):
            raise InvalidInput(f"FABRIC_XDP_FORWARD must be 0 or 1, got {self.xdp_forward!r}")
        _check("FABRIC_UDP_FLOW_SECS", self.udp_flow_secs, 1, 86400)
        _check("FABRIC_MISS_INSERTS", self.miss_inserts, 1, 10_000_000)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> DataplaneSettings:
        env = os.environ if env is None else env
        return cls(udp_flow_secs=_int(env, "FABRIC_UDP_FLOW_SECS", UDP_FLOW_SECS),
                   miss_inserts=_int(env, "FABRIC_MISS_INSERTS", MISS_INSERTS),
                   xdp_forward=_flag(env, "FABRIC_XDP_FORWARD", XDP_FORWARD))


def _flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    if raw not in ("0", "1"):
        raise InvalidInput(f"{name} must be 0 or 1, got {raw!r}")
    return raw == "1"


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise InvalidInput(f"{name} must be an integer, got {raw!r}") from None


def _check(name: str, value: object, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise InvalidInput(f"{name} must be an integer {low}-{high}, got {value!r}")
