"""The split's share as the real BPF dataplane holds it: weights from controlplane.routing.split
written with Dataplane.put_service, slot counts read back from the active Maglev table."""

from __future__ import annotations

import pytest

from common.maglev_quota import DEFAULT_SIZE
from controlplane.routing.split import split

VIP = "10.96.7.1"


@pytest.fixture(scope="module")
def plane(plain_plane):
    """The session's compiled plane (tests/conftest.py), opened maps-only: no compile of its own."""
    from agent.dataplane.dataplane import Dataplane

    assert plain_plane.table_size == DEFAULT_SIZE
    dp = Dataplane(pin_dir=plain_plane.pin_dir, programs=False)
    yield dp
    dp.close()


def new_slots(plane, port, new) -> int:
    view = plane.get_service(VIP, port, "tcp")
    return sum(b.slots for b in view.backends if b.address in new)


@pytest.mark.parametrize("percent,new,old", [
    (20, {"10.0.2.1:8000": 32}, {"10.0.1.1:8000": 32, "10.0.1.2:8000": 17, "10.0.1.3:8000": 9, "10.0.1.4:8000": 1}),
    (5, {"10.0.2.1:8000": 20}, {f"10.0.1.{i}:8000": 10 + i for i in range(1, 9)}),
    (50, {"10.0.2.1:8000": 3, "10.0.2.2:8000": 30}, {"10.0.1.1:8000": 32, "10.0.1.2:8000": 5}),
])
def test_canary_share_in_the_bpf_table_is_within_one_slot(plane, percent, new, old):
    port = 9000 + percent
    s = split(new, old, percent)
    plane.put_service(VIP, port, "tcp", s.weights)
    got = new_slots(plane, port, new)
    assert got == s.new_slots  # the agent built exactly the table fabricd computed
    assert abs(got - percent * DEFAULT_SIZE / 100) <= 1
    plane.delete_service(VIP, port, "tcp")


def test_blue_green_switch_is_one_save(plane):
    new = {"10.0.2.1:8000": 10, "10.0.2.2:8000": 10}
    old = {"10.0.1.1:8000": 10, "10.0.1.2:8000": 10}
    plane.put_service(VIP, 9100, "tcp", split(new, old, 0).weights)
    before = plane.get_service(VIP, 9100, "tcp")
    assert new_slots(plane, 9100, new) == 0 and {b.address for b in before.backends} == set(new) | set(old)
    plane.put_service(VIP, 9100, "tcp", split(new, old, 100).weights)
    after = plane.get_service(VIP, 9100, "tcp")
    assert new_slots(plane, 9100, new) == DEFAULT_SIZE and after.active_ring != before.active_ring
    # The old set stays in the service (its established flows keep their backend) at weight 0.
    assert {b.address: b.weight for b in after.backends if b.address in old} == {a: 0 for a in old}
    plane.delete_service(VIP, 9100, "tcp")
