"""VIP pool iteration rules (pure) and exclusive allocation on a real SQLite store."""

import pytest

from common.errors import Conflict, InvalidInput
from controlplane.placement.vip_pool import allocate, iter_addresses, owner_of, parse_pool, release
from controlplane.settings import load


def first(spec, n=None, avoid=True):
    out = list(iter_addresses(parse_pool(spec, avoid_buggy=avoid)))
    return out if n is None else out[:n]


@pytest.mark.parametrize(
    "spec, avoid, expected",
    [
        ("10.96.0.0/30", True, ["10.96.0.1", "10.96.0.2"]),
        ("10.96.0.0/30", False, ["10.96.0.1", "10.96.0.2"]),
        ("10.96.0.4/31", False, ["10.96.0.4", "10.96.0.5"]),
        ("10.96.0.7/32", True, ["10.96.0.7"]),
        ("10.96.0.255/32", True, []),
        ("10.96.0.255/32", False, ["10.96.0.255"]),
        ("10.96.0.254-10.96.1.1", True, ["10.96.0.254", "10.96.1.1"]),
        ("10.96.0.254-10.96.1.1", False, ["10.96.0.254", "10.96.0.255", "10.96.1.0", "10.96.1.1"]),
        ("10.1.1.5, 10.1.1.5, 10.1.1.6", True, ["10.1.1.5", "10.1.1.6"]),
        ("10.2.0.0/29,10.3.0.9", True, ["10.2.0.1", "10.2.0.2", "10.2.0.3", "10.2.0.4", "10.2.0.5",
                                         "10.2.0.6", "10.3.0.9"]),
    ],
)
def test_iteration(spec, avoid, expected):
    assert first(spec, avoid=avoid) == expected


def test_slash16_skips_buggy_octets_across_the_whole_pool():
    addrs = first("10.96.0.0/16")
    assert addrs[0] == "10.96.0.1"
    assert "10.96.1.0" not in addrs and "10.96.0.255" not in addrs
    assert len(addrs) == 256 * 254


@pytest.mark.parametrize(
    "spec, words",
    [
        ("10.0.0.0/8", "wider than /16"),
        ("fd00::/64", "IPv6"),
        ("fd00::1", "IPv6"),
        ("10.0.0.9-10.0.0.1", "ends before"),
        ("10.0.0.0-10.2.0.0", "longer than a /16"),
        ("banana", "not an IPv4"),
        ("10.0.0.0/33", "not a CIDR"),
        ("10.0.0.1,,10.0.0.2", "empty entry"),
    ],
)
def test_bad_pools_are_refused_with_a_message(spec, words):
    with pytest.raises(InvalidInput) as err:
        parse_pool(spec)
    assert words in err.value.message


def test_env_defaults_and_overrides():
    assert first_env({}) [:2] == ["10.96.0.1", "10.96.0.2"]
    assert first_env({"FABRIC_SERVICE_CIDR": "10.50.0.0/30"}) == ["10.50.0.1", "10.50.0.2"]
    assert first_env({"FABRIC_ADDRESS_POOL": "10.7.0.255", "FABRIC_SERVICE_CIDR": "10.50.0.0/30"}) == []
    assert first_env({"FABRIC_ADDRESS_POOL": "10.7.0.255", "FABRIC_AVOID_BUGGY_IPS": "0"}) == ["10.7.0.255"]


def first_env(env):
    return list(iter_addresses(load(env).pool))[:3]  # fabricd's settings read the pool once


def test_allocation_is_exclusive_idempotent_and_released_only_by_owner(store):
    pool = parse_pool("10.96.0.0/30")
    a = allocate(store, "ep-a", pool)
    b = allocate(store, "ep-b", pool)
    assert {a, b} == {"10.96.0.1", "10.96.0.2"}
    assert allocate(store, "ep-a", pool) == a
    with pytest.raises(Conflict):
        allocate(store, "ep-c", pool)
    assert release(store, a, "ep-b") is False
    assert owner_of(store, a) == "ep-a"
    assert release(store, a, "ep-a") is True
    assert allocate(store, "ep-c", pool) == a


def test_allocation_skips_an_address_another_process_created_meanwhile(store):
    from common import keyspace

    pool = parse_pool("10.96.0.0/29")
    store.create(keyspace.vips("10.96.0.1"), '{"endpoint": "other"}')
    assert allocate(store, "mine", pool) == "10.96.0.2"


def test_a_pass_lists_the_vips_once_and_its_claims_and_releases_enter_the_listing(store):
    from controlplane.placement.vip_pool import Held, allocations
    from lab.rigs.scale import CountingStore

    pool = parse_pool("10.96.0.0/29")
    allocate(store, "old", pool)
    counted = CountingStore(store)
    held = Held(allocations(counted))
    got = [allocate(counted, f"ep-{i}", pool, held=held) for i in range(3)] + [allocate(counted, "old", pool, held=held)]
    assert got == ["10.96.0.2", "10.96.0.3", "10.96.0.4", "10.96.0.1"]
    assert counted.calls.get("list") == 1  # the one listing; each new endpoint costs only its create
    assert held.owners == allocations(store) and held.by_owner["ep-1"] == "10.96.0.3"
    assert release(counted, "10.96.0.3", "ep-1", held=held) and "ep-1" not in held.by_owner
    assert allocate(counted, "new", pool, held=held) == "10.96.0.3" and counted.calls.get("list") == 1
