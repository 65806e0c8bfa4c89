"""The lab chaos run's own parts that need no lab: the scan's SYN segments and the Maglev
invariant's judgement (on a real SQLite store, with the services the agent would report).
The run itself is tests/e2e/test_lab_story.py's chaos chapter and scripts/chaos."""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass, field

from common import keyspace
from common.schemas import EndpointStatus, InferenceEndpoint, Replica
from common.store.base import Store
from common.store.connect import open_store
from lab.rigs.chaos_vip import maglev_problems
from lab.rigs.syn_scan import checksum, syn_segment


def test_syn_segment_is_a_checksummed_syn_from_the_given_port():
    seg = syn_segment("10.245.0.2", "10.96.0.7", 4242, 8000, 123456)
    sport, dport, seq, ack, offset, flags, _window, _csum, _urg = struct.unpack("!HHIIBBHHH", seg)
    assert (sport, dport, seq, ack, offset >> 4, flags) == (4242, 8000, 123456, 0, 5, 0x02)
    pseudo = socket.inet_aton("10.245.0.2") + socket.inet_aton("10.96.0.7") + struct.pack("!BBH", 0, 6, len(seg))
    assert checksum(pseudo + seg) == 0  # a receiver's check over the whole segment comes out 0
    # the checksum covers the addresses: the same segment to another VIP does not check out
    other = socket.inet_aton("10.245.0.2") + socket.inet_aton("10.96.0.8") + struct.pack("!BBH", 0, 6, len(seg))
    assert checksum(other + seg) != 0


@dataclass
class FakeAgentView:
    """What maglev_problems asks of a rig: the store and the agent's services."""

    store: Store
    services: list[dict] = field(default_factory=list)

    def maglev_services(self) -> list[dict]:
        return self.services


def _svc(vip: str, ring: dict[str, int]) -> dict:
    return {"vip": vip, "port": 8000, "proto": "tcp",
            "stats": [{"address": a, "weight": 1, "slots": n} for a, n in ring.items()]}


def test_maglev_invariant_names_every_way_it_can_break(tmp_path):
    store = open_store(f"sqlite://{tmp_path}/fabric.db")
    try:
        for name, dep, vip in (("ep-a", "dep-a", "10.96.0.1"), ("ep-b", "dep-b", "10.96.0.2")):
            ep = InferenceEndpoint(name=name, deployment=dep, status=EndpointStatus(phase="Ready", vip=vip))
            store.put(keyspace.endpoints(name), ep.model_dump_json())
        for rid, dep, host, ready in (("a-0", "dep-a", "10.244.0.2", True), ("a-1", "dep-a", "10.244.0.3", False),
                                      ("b-0", "dep-b", "10.244.0.4", True)):
            rep = Replica(replica_id=rid, deployment=dep, ordinal=0, node="n", host=host, port=8000,
                          phase="Ready" if ready else "Failed", ready=ready)
            store.put(keyspace.replicas(dep, rid), rep.model_dump_json())
        view = FakeAgentView(store)

        # whole: both endpoints served by rings of ready replicas; a draining backend at 0 slots is fine
        view.services = [_svc("10.96.0.1", {"10.244.0.2:8000": 65537, "10.244.0.3:8000": 0}),
                         _svc("10.96.0.2", {"10.244.0.4:8000": 65537})]
        assert maglev_problems(view) == []

        # a ring that still holds a replica that is not ready
        view.services[0] = _svc("10.96.0.1", {"10.244.0.2:8000": 30000, "10.244.0.3:8000": 35537})
        assert maglev_problems(view) == ["10.96.0.1 (ep-a) ring holds backends that are not ready: ['10.244.0.3:8000']"]

        # a service whose VIP no endpoint has, and an endpoint with ready replicas left without a ring
        view.services = [_svc("10.96.0.1", {"10.244.0.2:8000": 65537}), _svc("10.96.0.9", {"10.244.0.4:8000": 65537})]
        assert maglev_problems(view) == [
            "service 10.96.0.9:8000 has no endpoint",
            "endpoint ep-b (VIP 10.96.0.2) has ready replicas but no Maglev ring",
        ]
    finally:
        store.close()
