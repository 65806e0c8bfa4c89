"""Verdict codes of the XDP program, mirrored from dataplane/bpf/verdicts.h.

A test parses the header and compares it with this enum, so a code added on one
side only fails CI.
"""

from __future__ import annotations

import re
from enum import IntEnum
from pathlib import Path

from dataplane import BPF_DIR

VERDICTS_HEADER = BPF_DIR / "verdicts.h"


class Verdict(IntEnum):
    PASS_NOT_IPV4 = 0
    PASS_NOT_VIP = 1
    PASS_NOT_TCP_UDP = 2
    DROP_TRUNCATED = 3
    DROP_IP_OPTIONS = 4
    DROP_FRAGMENT = 5
    PASS_UNKNOWN_PORT = 6
    DROP_NO_BACKEND = 7
    DROP_SNAT_EXHAUSTED = 8
    FWD_NEW_FLOW = 9
    FWD_ESTABLISHED = 10
    REPLY_SNAT = 11
    FWD_MISS_RECORDED = 12
    FWD_UNTRACKED = 13
    FWD_REPICKED = 14
    DROP_UNTRACKED_SNAT = 15
    TC_REPLY = 16
    REPLY_ICMP_ECHO = 17
    FWD_ICMP_ERROR = 18
    REPLY_ICMP_ERROR = 19


VERDICT_MAX = 20


class Xmit(IntEnum):
    """How a translated packet left the node (XMIT_* in verdicts.h, counted in xmit_stats)."""

    STACK = 0
    REDIRECT = 1
    TX = 2
    NO_ROUTE = 3
    NO_NEIGH = 4
    FRAG_NEEDED = 5
    UNKNOWN_DEV = 6
    TTL = 7
    FIB_CACHED = 8


XMIT_MAX = 9


def parse_verdicts_header(path: Path = VERDICTS_HEADER, prefix: str = "VERDICT") -> dict[str, int]:
    """Every `#define <PREFIX>_<NAME> <n>` of the header, <PREFIX>_MAX included."""
    pattern = re.compile(rf"^#define\s+{prefix}_(\w+)\s+(\d+)\b", re.MULTILINE)
    return {name: int(value) for name, value in pattern.findall(path.read_text())}
