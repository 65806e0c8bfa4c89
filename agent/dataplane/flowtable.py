"""Reading the connection table: active flows per backend, for drains.

The kernel's LRU keeps no count of its entries, and entries of finished flows
linger until evicted, so "how many flows still use this backend" is answered by
scanning the forward table: an entry counts while its client has not sent FIN
or RST and, for UDP, while it has been heard from within udp_flow_secs (the
time after which the program would pick again). A drain ends when its backend's
count reaches zero or its grace passes. The scan costs about a second per
million entries: it runs when a view is asked for, never on the packet path.
"""

from __future__ import annotations

import socket
import time
from collections import Counter
from collections.abc import Iterable

FLOW_CLOSED = 1  # maps.h


def monotonic_ns() -> int:
    """The clock bpf_ktime_get_ns() reads."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def active_flows(entries: Iterable[tuple[object, object]], now_ns: int, udp_flow_secs: int) -> Counter:
    """(service id, backend ip, backend port) in map order -> flows still active."""
    limit = udp_flow_secs * 1_000_000_000
    out: Counter = Counter()
    for key, flow in entries:
        if flow.flags & FLOW_CLOSED:
            continue
        if key.proto == socket.IPPROTO_UDP and now_ns - flow.last_seen > limit:
            continue
        out[(flow.service_id, flow.backend_ip, flow.backend_port)] += 1
    return out
