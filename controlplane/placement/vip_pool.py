"""Endpoint VIPs: the address pool, its iteration order, and exclusive allocation in the store.

Pool syntax (FABRIC_ADDRESS_POOL, comma-separated): CIDRs (``10.96.0.0/24``), ``start-end``
ranges (``10.97.0.10-10.97.0.20``) and single IPv4 addresses. Without it the pool is
FABRIC_SERVICE_CIDR (default ``10.96.0.0/16``).

Iteration rules (pure, see ``iter_addresses``):
  - entries in the order written, addresses ascending within each entry, no duplicates;
  - a CIDR of /30 or wider skips its network and broadcast address (``10.96.0.0/30`` -> .1, .2);
    /31 and /32 have neither, every address is usable;
  - with FABRIC_AVOID_BUGGY_IPS on (the default) an address whose last octet is 0 or 255 is
    skipped, because some stacks and middleboxes mistreat them;
  - prefixes wider than /16, ranges longer than a /16, and IPv6 are refused with a message.

Allocation takes ``keyspace.vips(ip)`` with create-if-absent, so two control planes never hold
the same VIP; the value names the owning endpoint so release only frees one's own address.
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from common.errors import Conflict, InvalidInput
from common.records import vips
from common.schemas import InferenceEndpoint
from common.store.base import Store

DEFAULT_SERVICE_CIDR = "10.96.0.0/16"
MAX_ADDRESSES_PER_ENTRY = 1 << 16  # a /16


@dataclass(frozen=True)
class PoolEntry:
    """One pool entry as an inclusive integer range plus the network/broadcast to skip."""

    text: str
    first: int
    last: int
    skip: frozenset[int] = frozenset()


@dataclass(frozen=True)
class AddressPool:
    entries: tuple[PoolEntry, ...]
    avoid_buggy: bool = True


def _ipv4(text: str, where: str) -> ipaddress.IPv4Address:
    try:
        addr = ipaddress.ip_address(text.strip())
    except ValueError:
        raise InvalidInput(f"address pool entry {where!r}: {text.strip()!r} is not an IPv4 address") from None
    if addr.version != 4:
        raise InvalidInput(f"address pool entry {where!r}: IPv6 is not supported for VIPs")
    return addr


def parse_entry(text: str) -> PoolEntry:
    text = text.strip()
    if not text:
        raise InvalidInput("address pool has an empty entry")
    if "/" in text:
        try:
            net = ipaddress.ip_network(text, strict=False)
        except ValueError:
            raise InvalidInput(f"address pool entry {text!r} is not a CIDR") from None
        if net.version != 4:
            raise InvalidInput(f"address pool entry {text!r}: IPv6 is not supported for VIPs")
        if net.prefixlen < 16:
            raise InvalidInput(f"address pool entry {text!r}: prefixes wider than /16 are refused")
        first, last = int(net.network_address), int(net.broadcast_address)
        skip = frozenset({first, last}) if net.prefixlen <= 30 else frozenset()
        return PoolEntry(text, first, last, skip)
    if "-" in text:
        start_s, _, end_s = text.partition("-")
        start, end = int(_ipv4(start_s, text)), int(_ipv4(end_s, text))
        if end < start:
            raise InvalidInput(f"address pool entry {text!r}: the range ends before it starts")
        if end - start + 1 > MAX_ADDRESSES_PER_ENTRY:
            raise InvalidInput(f"address pool entry {text!r}: ranges longer than a /16 are refused")
        return PoolEntry(text, start, end)
    addr = int(_ipv4(text, text))
    return PoolEntry(text, addr, addr)


def parse_pool(spec: str, *, avoid_buggy: bool = True) -> AddressPool:
    return AddressPool(tuple(parse_entry(part) for part in spec.split(",")), avoid_buggy)




def iter_addresses(pool: AddressPool) -> Iterator[str]:
    """Every usable address of the pool, in allocation order."""
    seen: set[int] = set()
    for entry in pool.entries:
        for value in range(entry.first, entry.last + 1):
            if value in entry.skip or value in seen:
                continue
            if pool.avoid_buggy and (value & 0xFF) in (0, 255):
                continue
            seen.add(value)
            yield str(ipaddress.IPv4Address(value))


def owner_of(store: Store, address: str) -> str | None:
    return vips.owner(store, address)


def allocations(store: Store) -> dict[str, str]:
    """address -> owning endpoint for every allocated VIP."""
    return vips.owners(store)


def dsr_vips(deployment: str, endpoints: Iterable[InferenceEndpoint], owners: Mapping[str, str]) -> list[str]:
    """The VIPs a new replica of ``deployment`` must answer for: those of the dsr-ipip endpoints
    exposing it that already hold one (``owners``: address -> endpoint, from ``allocations``)."""
    wanted = {ep.name for ep in endpoints if ep.deployment == deployment and ep.forwarding == "dsr-ipip"}
    return sorted((vip for vip, owner in owners.items() if owner in wanted), key=ipaddress.IPv4Address)


class Held:
    """The VIPs held (address -> owner, and each owner's first address), listed once for a pass
    that allocates for many endpoints; what ``allocate`` and ``release`` do through it is entered."""

    def __init__(self, owners: Mapping[str, str]):
        self.owners = dict(owners)
        self.by_owner: dict[str, str] = {}
        for address, owner in self.owners.items():
            self.by_owner.setdefault(owner, address)

    def drop(self, address: str) -> None:
        owner = self.owners.pop(address, None)
        if owner is not None and self.by_owner.get(owner) == address:
            del self.by_owner[owner]
            for other, who in self.owners.items():  # another address of the same owner, if any
                if who == owner:
                    self.by_owner[owner] = other
                    break


def allocate(store: Store, endpoint: str, pool: AddressPool, *, now: float | None = None,
             held: Held | None = None) -> str:
    """The endpoint's VIP: its existing one, else the first free address taken with create.

    Losing a create race to another control plane just moves on to the next address. ``held``:
    the VIPs as the caller listed them (else they are listed here); the address taken is entered."""
    held = Held(allocations(store)) if held is None else held
    mine = held.by_owner.get(endpoint)
    if mine is not None:
        return mine
    now = time.time() if now is None else now
    for address in iter_addresses(pool):
        if address in held.owners:
            continue
        if vips.claim(store, address, endpoint, now):
            held.owners[address] = endpoint
            held.by_owner[endpoint] = address
            return address
    raise Conflict(f"address pool is exhausted: no free VIP for endpoint {endpoint!r}")


def release(store: Store, address: str, endpoint: str, *, held: Held | None = None) -> bool:
    """Free the address only if this endpoint still holds it; True if a key was deleted (then
    ``held`` forgets it)."""
    released = vips.release(store, address, endpoint)
    if released and held is not None:
        held.drop(address)
    return released
