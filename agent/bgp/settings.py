"""FABRIC_BGP_*: this node's BGP settings, read once at start (off by default).

    FABRIC_BGP=1                      turn announcements on (anything but 0/1/unset is refused)
    FABRIC_BGP_LOCAL_ASN=65001        this node's AS number (1-4294967294); required when on
    FABRIC_BGP_PEERS=IP:ASN[,IP:ASN]  the routers to peer with; required when on
    FABRIC_BGP_ROUTER_ID=IPv4         default: the node address (--node-ip), else the first peer's
                                      source address as BIRD picks it
    FABRIC_BGP_COMMUNITIES=A:B[,A:B]  standard communities attached to every announcement
    FABRIC_BGP_HOLD_SECS=9            hold time offered to peers (3-65535); keepalives every third
    FABRIC_BGP_BFD=0|1                BFD on every session (sub-second failure detection)
    FABRIC_BGP_BFD_INTERVAL_MS=100    BFD tx/rx interval (10-10000); detection is 3 intervals
    FABRIC_BGP_BIRD=bird              the BIRD 2 binary the agent runs (birdc is found beside it)

A bad value raises InvalidInput naming the variable; `fabric-agent serve` turns it into exit 2.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass

from common.errors import InvalidInput

DEFAULT_HOLD_SECS = 9
DEFAULT_BFD_INTERVAL_MS = 100
MAX_ASN = 4294967294  # 4294967295 is reserved (RFC 7300)


@dataclass(frozen=True)
class Peer:
    address: str
    asn: int

    @property
    def name(self) -> str:
        """BIRD protocol name: letters, digits and underscores only."""
        return "peer_" + self.address.replace(".", "_")


@dataclass(frozen=True)
class BgpSettings:
    enabled: bool = False
    local_asn: int = 0
    peers: tuple[Peer, ...] = ()
    router_id: str | None = None
    communities: tuple[tuple[int, int], ...] = ()
    hold_secs: int = DEFAULT_HOLD_SECS
    bfd: bool = False
    bfd_interval_ms: int = DEFAULT_BFD_INTERVAL_MS
    bird: str = "bird"

    def __post_init__(self) -> None:
        if not self.enabled:
            return
        if not isinstance(self.local_asn, int) or not 1 <= self.local_asn <= MAX_ASN:
            raise InvalidInput(f"FABRIC_BGP_LOCAL_ASN must be an AS number 1-{MAX_ASN}, got {self.local_asn!r}")
        if not self.peers:
            raise InvalidInput("FABRIC_BGP_PEERS must name at least one peer (IP:ASN) when FABRIC_BGP=1")
        if len({p.address for p in self.peers}) != len(self.peers):
            raise InvalidInput("FABRIC_BGP_PEERS names a peer twice")
        if not 3 <= self.hold_secs <= 65535:
            raise InvalidInput(f"FABRIC_BGP_HOLD_SECS must be an integer 3-65535, got {self.hold_secs!r}")
        if not 10 <= self.bfd_interval_ms <= 10000:
            raise InvalidInput(f"FABRIC_BGP_BFD_INTERVAL_MS must be an integer 10-10000, got {self.bfd_interval_ms!r}")
        if not self.bird or any(c.isspace() for c in self.bird):
            raise InvalidInput(f"FABRIC_BGP_BIRD must be a path without spaces, got {self.bird!r}")

    @property
    def keepalive_secs(self) -> int:
        return max(1, self.hold_secs // 3)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, node_ip: str | None = None) -> BgpSettings:
        env = os.environ if env is None else env
        raw = env.get("FABRIC_BGP", "")
        if raw not in ("", "0", "1"):
            raise InvalidInput(f"FABRIC_BGP must be 0 or 1, got {raw!r}")
        if raw != "1":
            return cls()
        router_id = env.get("FABRIC_BGP_ROUTER_ID", "") or node_ip or None
        if router_id is not None:
            router_id = _ipv4("FABRIC_BGP_ROUTER_ID" if env.get("FABRIC_BGP_ROUTER_ID") else "--node-ip", router_id)
        bfd = env.get("FABRIC_BGP_BFD", "")
        if bfd not in ("", "0", "1"):
            raise InvalidInput(f"FABRIC_BGP_BFD must be 0 or 1, got {bfd!r}")
        return cls(enabled=True,
                   local_asn=_int(env, "FABRIC_BGP_LOCAL_ASN", 0),
                   peers=_peers(env.get("FABRIC_BGP_PEERS", "")),
                   router_id=router_id,
                   communities=_communities(env.get("FABRIC_BGP_COMMUNITIES", "")),
                   hold_secs=_int(env, "FABRIC_BGP_HOLD_SECS", DEFAULT_HOLD_SECS),
                   bfd=bfd == "1",
                   bfd_interval_ms=_int(env, "FABRIC_BGP_BFD_INTERVAL_MS", DEFAULT_BFD_INTERVAL_MS),
                   bird=env.get("FABRIC_BGP_BIRD", "") or "bird")


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "")
    if raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise InvalidInput(f"{name} must be an integer, got {raw!r}") from None


def _ipv4(name: str, raw: str) -> str:
    try:
        addr = ipaddress.IPv4Address(raw.strip())
    except ValueError:
        raise InvalidInput(f"{name} must be an IPv4 address, got {raw!r}") from None
    if addr.is_unspecified or addr.is_multicast or addr.is_loopback:
        raise InvalidInput(f"{name} must be a unicast, non-loopback IPv4 address, got {raw!r}")
    return str(addr)


def _peers(raw: str) -> tuple[Peer, ...]:
    peers = []
    for item in (p.strip() for p in raw.split(",")):
        if not item:
            continue
        ip, sep, asn = item.rpartition(":")
        if not sep:
            raise InvalidInput(f"FABRIC_BGP_PEERS: expected IP:ASN, got {item!r}")
        address = _ipv4("FABRIC_BGP_PEERS", ip)
        try:
            number = int(asn)
        except ValueError:
            raise InvalidInput(f"FABRIC_BGP_PEERS: ASN of {address} must be an integer, got {asn!r}") from None
        if not 1 <= number <= MAX_ASN:
            raise InvalidInput(f"FABRIC_BGP_PEERS: ASN of {address} must be 1-{MAX_ASN}, got {number}")
        peers.append(Peer(address, number))
    return tuple(peers)


def _communities(raw: str) -> tuple[tuple[int, int], ...]:
    out = []
    for item in (c.strip() for c in raw.split(",")):
        if not item:
            continue
        a, sep, b = item.partition(":")
        try:
            pair = (int(a), int(b)) if sep else None
        except ValueError:
            pair = None
        if pair is None or not all(0 <= v <= 65535 for v in pair):
            raise InvalidInput(f"FABRIC_BGP_COMMUNITIES: expected A:B with 0-65535 each, got {item!r}")
        out.append(pair)
    return tuple(out)
