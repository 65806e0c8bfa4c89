"""Reading the live maps: services, backends, views, counters (no writes here).

`MapReader` is the read half of `Dataplane`: it expects the BCC tables the
Dataplane opens (`_services`, `_backends`, `_rings`, ...) and never takes the
writer lock, so the CLI's `show` runs beside a writing agent.
"""

from __future__ import annotations

import ctypes

import numpy as np

from agent.dataplane.addresses import (
    PROTOCOL_NAMES,
    PROTOCOLS,
    ServiceAddress,
    ip_from_map,
    ip_to_map,
    port_from_map,
    port_to_map,
    service_address,
)
from agent.dataplane.flowtable import active_flows, monotonic_ns
from agent.dataplane.loader import MAX_BACKENDS
from agent.dataplane.plan import BackendState, ServiceState
from agent.dataplane.verdicts import Verdict
from agent.dataplane.views import BackendView, FlowMisses, ServiceView

BACKEND_SNAT = 1
BACKEND_DRAINING = 2
BACKEND_IN_USE = 4
SERVICE_NO_BACKENDS = 1
SERVICE_DSR = 2


class MapReader:
    table_size: int

    def _read_backends(self) -> dict[int, object]:
        """backend id -> map entry, for entries in use."""
        out = {}
        for k, v in _items(self._backends):
            if v.flags & BACKEND_IN_USE:
                out[k if isinstance(k, int) else k.value] = _copy(v)
        return out

    def _read_services(self) -> dict[ServiceAddress, object]:
        out = {}
        for k, v in self._services.items():
            addr = ServiceAddress(ip_from_map(k.vip), port_from_map(k.port), PROTOCOL_NAMES.get(k.proto, str(k.proto)))
            out[addr] = _copy(v)
        return out

    def _service_state(self, svc, backends: dict[int, object]) -> ServiceState:
        states, ids = {}, {}
        for bid, b in backends.items():
            if b.service != svc.id:
                continue
            key = f"{ip_from_map(b.ip)}:{port_from_map(b.port)}"
            states[key] = BackendState(weight=b.weight, draining=bool(b.flags & BACKEND_DRAINING),
                                       snat=bool(b.flags & BACKEND_SNAT))
            ids[key] = bid
        return ServiceState(service_id=svc.id, active=svc.active, no_backends=bool(svc.flags & SERVICE_NO_BACKENDS),
                            backends=states, backend_ids=ids, forwarding=_forwarding(svc))

    def _service_key(self, addr: ServiceAddress):
        key = self._services.Key()
        key.vip = ip_to_map(addr.vip)
        key.port = port_to_map(addr.port)
        key.proto = PROTOCOLS[addr.proto]
        return key

    # -- views ----------------------------------------------------------------

    def _ring_counts(self, ring_id: int) -> np.ndarray:
        ring = self._rings[ctypes.c_uint32(ring_id)]
        data = np.frombuffer(bytes(ring), dtype=np.uint32, count=self.table_size)
        return np.bincount(data, minlength=MAX_BACKENDS)

    def _udp_flow_secs(self) -> int:
        return self._config[ctypes.c_uint32(0)].udp_flow_secs or 30

    def active_flow_counts(self):
        """(service id, backend ip, backend port) in map order -> active flows (flowtable.py)."""
        return active_flows(_items(self._flows), monotonic_ns(), self._udp_flow_secs())

    def _view(self, addr: ServiceAddress, svc, backends: dict[int, object], active) -> ServiceView:
        no_backends = bool(svc.flags & SERVICE_NO_BACKENDS)
        counts = None if no_backends else self._ring_counts(svc.id * 2 + svc.active)
        views = []
        for bid, b in backends.items():
            if b.service != svc.id:
                continue
            per_cpu = self._backend_stats[ctypes.c_uint32(bid)]
            slots = int(counts[bid]) if counts is not None else 0
            views.append(BackendView(
                address=f"{ip_from_map(b.ip)}:{port_from_map(b.port)}",
                weight=b.weight,
                draining=bool(b.flags & BACKEND_DRAINING),
                source_nat=bool(b.flags & BACKEND_SNAT),
                slots=slots,
                share=slots / self.table_size,
                packets=sum(s.packets for s in per_cpu),
                bytes=sum(s.bytes for s in per_cpu),
                active_flows=active.get((svc.id, b.ip, b.port), 0),
            ))
        views.sort(key=lambda v: v.address)
        return ServiceView(vip=addr.vip, port=addr.port, proto=addr.proto, active_ring=svc.active,
                           no_backends=no_backends, backends=views, misses=self._service_misses(svc.id),
                           forwarding=_forwarding(svc))

    def get_service(self, vip: str, port: int, proto: str) -> ServiceView | None:
        addr = service_address(vip, port, proto)
        svc = self._read_services().get(addr)
        if svc is None:
            return None
        return self._view(addr, svc, self._read_backends(), self.active_flow_counts())

    def list_services(self) -> list[ServiceView]:
        backends = self._read_backends()
        active = self.active_flow_counts()
        return [self._view(addr, svc, backends, active) for addr, svc in sorted(self._read_services().items())]

    def _service_misses(self, service_id: int) -> FlowMisses:
        per_cpu = self._misses[ctypes.c_uint32(service_id)]
        return FlowMisses(syn=sum(m.syn for m in per_cpu), other=sum(m.other for m in per_cpu))

    def flow_misses(self) -> dict[ServiceAddress, FlowMisses]:
        """Connection-table misses of every service, SYN and other (Prometheus)."""
        return {addr: self._service_misses(svc.id) for addr, svc in self._read_services().items()}

    def verdict_counters(self) -> dict[str, int]:
        out = {}
        for verdict in Verdict:
            out[verdict.name.lower()] = int(sum(self._verdicts[ctypes.c_uint32(verdict.value)]))
        return out


def _forwarding(svc) -> str:
    return "dsr-ipip" if svc.flags & SERVICE_DSR else "nat"


def _items(table) -> list:
    """All (key, value) pairs of a map, in one batch syscall where the kernel has it."""
    try:
        return list(table.items_lookup_batch())
    except Exception:  # noqa: BLE001  BCC raises bare Exception; batch ops need kernel 5.6+
        return list(table.items())


def _copy(value):
    """BCC hands out entries that may be reused by the next lookup; keep our own copy."""
    clone = type(value)()
    ctypes.memmove(ctypes.addressof(clone), ctypes.addressof(value), ctypes.sizeof(value))
    return clone
