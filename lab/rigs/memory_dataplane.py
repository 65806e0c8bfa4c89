"""The agent.dataplane.Dataplane surface in memory, for agent API tests where the BPF one is beside
the point (the BPF dataplane has its own tests in tests/dataplane)."""

from __future__ import annotations


class MemoryDataplane:
    def __init__(self):
        self.services: dict[tuple[str, int, str], dict] = {}

    def put_service(self, vip, port, proto, backends, draining=(), forwarding="nat"):
        self.services[(vip, port, proto)] = {"vip": vip, "port": port, "proto": proto, "forwarding": forwarding,
                                             "backends": dict(backends), "draining": list(draining)}
        return True

    def delete_service(self, vip, port, proto):
        return self.services.pop((vip, port, proto), None) is not None

    def get_service(self, vip, port, proto):
        return self.services.get((vip, port, proto))

    def list_services(self):
        return list(self.services.values())

    def readiness(self):
        return [(vip, port, proto, sum(1 for b, w in s["backends"].items() if w > 0 and b not in s["draining"]), len(s["backends"]))
                for (vip, port, proto), s in self.services.items()]
