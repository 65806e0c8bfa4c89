"""The agent's handle on the XDP Maglev dataplane: load, attach, update services.

Invariants:
* All state lives in pinned maps (loader.py); a new Dataplane on the same
  pin_dir sees exactly what the previous process left, so `put_service` with an
  unchanged backend set is a no-op after a restart too.
* A service's Maglev table is written into its inactive ring, then one update of
  the service entry switches `active`: packets see the old or the new table,
  never a half-written one.
* Removed, weight-0 and draining backends take no new flows; established flows
  keep their backend through the connection table, which stores the backend's
  address itself.
* Derived maps the fast paths read instead of hash lookups, kept in step here:
  `vip_filter` (bitmap of hashed VIP addresses, rebuilt from `vips`),
  `service_slots` (service id -> its VIP:port/proto while it exists) and
  `backend_addrs` (backend IP:port -> mask of service ids it serves or served,
  read by the TC reply path). `_sync_derived` rebuilds them on open.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable, Mapping

import numpy as np

from agent.dataplane import attach as attach_mod
from agent.dataplane.addresses import (
    PROTOCOL_NAMES,
    PROTOCOLS,
    ServiceAddress,
    ip_from_map,
    ip_to_map,
    parse_backend,
    parse_ipv4,
    port_from_map,
    port_to_map,
    service_address,
)
from agent.dataplane.loader import MAX_BACKENDS, MAX_SERVICES, load
from agent.dataplane.plan import BackendState, ServiceState, allocate_ids, plan_service
from agent.dataplane.verdicts import Verdict
from agent.dataplane.views import BackendView, ServiceView
from agent.maglev import MAX_WEIGHT, build_maglev_indices
from common.errors import Conflict, InvalidInput

BACKEND_SNAT = 1
BACKEND_DRAINING = 2
BACKEND_IN_USE = 4
SERVICE_NO_BACKENDS = 1
SLOT_IN_USE = 1
# vip_filter in dataplane/bpf/maps.h
VIP_FILTER_BITS = 4096
VIP_FILTER_MULT = 0x9E3779B1
VIP_FILTER_SHIFT = 20


def vip_filter_bit(map_ip: int) -> int:
    """The filter bit of a VIP, as xdp_maglev computes it from the address in network order."""
    return ((map_ip * VIP_FILTER_MULT) & 0xFFFFFFFF) >> VIP_FILTER_SHIFT


class Dataplane:
    def __init__(self, pin_dir: str = "/sys/fs/bpf/fabric", node_ip: str | None = None, table_size: int = 65537,
                 *, route_netns: str | None = None):
        """Load the programs, creating or re-opening the pinned maps under pin_dir.

        route_netns: the namespace whose routes tell local (bridge) backends from
        routed ones that need source NAT; defaults to the namespace of the last
        attach, else the agent's own.
        """
        self.node_ip = parse_ipv4(node_ip, "node_ip") if node_ip else None
        self._route_netns = route_netns
        self._prog = load(pin_dir, table_size)
        self.table_size = table_size
        bpf = self._prog.bpf  # table names as bytes: BCC warns on str
        self._services = bpf[b"services"]
        self._vips = bpf[b"vips"]
        self._rings = bpf[b"rings"]
        self._backends = bpf[b"backends"]
        self._backend_stats = bpf[b"backend_stats"]
        self._verdicts = bpf[b"verdict_stats"]
        self._config = bpf[b"config"]
        self._vip_filter = bpf[b"vip_filter"]
        self._service_slots = bpf[b"service_slots"]
        self._backend_addrs = bpf[b"backend_addrs"]
        self._flows = bpf[b"flows"]
        self._write_config()
        self._sync_derived()

    # -- config and attachment ------------------------------------------------

    def _write_config(self) -> None:
        key = ctypes.c_uint32(0)
        cfg = self._config[key]
        if cfg.table_size and cfg.table_size != self.table_size:
            raise Conflict(f"maps under {self._prog.pin_dir} use table size {cfg.table_size}, not {self.table_size}")
        cfg.table_size = self.table_size
        if self.node_ip:
            cfg.node_ip = ip_to_map(self.node_ip)
        self._config[key] = cfg

    def attach(self, iface: str, netns: str | None = None) -> None:
        attach_mod.attach_programs(iface, netns, self._prog.xdp, self._prog.tc.fd, source_nat=bool(self.node_ip))
        if self._route_netns is None:
            self._route_netns = netns

    def detach(self, iface: str, netns: str | None = None) -> None:
        attach_mod.detach_programs(iface, netns)

    @property
    def xdp_fd(self) -> int:
        return self._prog.xdp.fd

    def _sync_derived(self) -> None:
        """Add to vip_filter, service_slots and backend_addrs whatever the services
        and backends need and they lack (maps made by an older layout, or a crash
        between two writes). Only adds, and writes nothing when all is there: a
        second process (the CLI) opening the maps must not race the agent's updates."""
        services = self._read_services()
        for addr, svc in services.items():
            want = self._slot_value(addr)
            if bytes(self._service_slots[ctypes.c_uint32(svc.id)]) != bytes(want):
                self._service_slots[ctypes.c_uint32(svc.id)] = want
        live = {svc.id for svc in services.values()}
        for b in self._read_backends().values():
            if b.service in live:
                self._add_backend_addr(b.ip, b.port, b.service)
        have = self._vip_filter[ctypes.c_uint32(0)]
        need = self._filter_words()
        if any(have.words[i] & w != w for i, w in enumerate(need)):
            for i, w in enumerate(need):
                have.words[i] |= w
            self._vip_filter[ctypes.c_uint32(0)] = have

    # -- reading the maps -----------------------------------------------------

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
                            backends=states, backend_ids=ids)

    def _service_key(self, addr: ServiceAddress):
        key = self._services.Key()
        key.vip = ip_to_map(addr.vip)
        key.port = port_to_map(addr.port)
        key.proto = PROTOCOLS[addr.proto]
        return key

    # -- updates --------------------------------------------------------------

    def _wanted(self, backends: Mapping[str, int], draining: Iterable[str]) -> dict[str, BackendState]:
        draining = {f"{ip}:{port}" for ip, port in (parse_backend(d) for d in draining)}
        wanted = {}
        for text, weight in backends.items():
            ip, port = parse_backend(text)
            if not isinstance(weight, int) or isinstance(weight, bool) or not 0 <= weight <= MAX_WEIGHT:
                raise InvalidInput(f"weight of backend {ip}:{port} must be an integer 0-{MAX_WEIGHT}, got {weight!r}")
            key = f"{ip}:{port}"
            wanted[key] = BackendState(weight=weight, draining=key in draining, snat=self._needs_snat(ip))
        return wanted

    def _needs_snat(self, ip: str) -> bool:
        if not self.node_ip:
            return False
        return not attach_mod.route_is_via_bridge(ip, self._route_netns)

    def put_service(self, vip: str, port: int, proto: str, backends: Mapping[str, int],
                    draining: Iterable[str] = ()) -> bool:
        """Create or update a service; True if the maps changed."""
        addr = service_address(vip, port, proto)
        wanted = self._wanted(backends, draining)
        services = self._read_services()
        all_backends = self._read_backends()
        existing = services.get(addr)
        current = self._service_state(existing, all_backends) if existing is not None else None
        plan = plan_service(current, wanted)
        if not plan.changed:
            return False

        if current is None:
            try:
                service_id = allocate_ids({s.id for s in services.values()}, 1, MAX_SERVICES)[0]
            except ValueError:
                raise Conflict(f"no room for another service (limit {MAX_SERVICES})") from None
            active = 1  # so the first table goes to ring 0
        else:
            service_id, active = current.service_id, current.active
        try:
            new_ids = allocate_ids(set(all_backends), len(plan.add), MAX_BACKENDS)
        except ValueError:
            raise Conflict(f"no room for {len(plan.add)} more backends (limit {MAX_BACKENDS})") from None
        ids = dict(plan.keep) | dict(zip(plan.add, new_ids))
        for key, bid in ids.items():
            self._write_backend(bid, key, wanted[key], service_id)

        inactive = 1 - active
        if not plan.no_backends:
            keys, table = build_maglev_indices(plan.table_weights, self.table_size)
            backend_ids = np.asarray([ids[k] for k in keys], dtype=np.uint32)[table]
            self._write_ring(service_id * 2 + inactive, backend_ids)
        for key in ids:  # the TC reply path finds this service's flows from the backend address
            ip, port = parse_backend(key)
            self._add_backend_addr(ip_to_map(ip), port_to_map(port), service_id)
        if current is None:
            # re-created: flows still in the table keep their backend, listed or not,
            # so their replies need this service's bit on those addresses too
            for map_ip, map_port in self._flow_backends(addr):
                self._add_backend_addr(map_ip, map_port, service_id)
            self._write_slot(service_id, addr)
        entry = self._services.Leaf()
        entry.id = service_id
        entry.active = inactive if not plan.no_backends else active
        entry.flags = SERVICE_NO_BACKENDS if plan.no_backends else 0
        self._services[self._service_key(addr)] = entry  # the switch: one map update
        if current is None:
            self._vip_ref(addr.vip, +1)
        for bid in plan.free:
            self._clear_backend(bid)
        return True

    def delete_service(self, vip: str, port: int, proto: str) -> bool:
        addr = service_address(vip, port, proto)
        services = self._read_services()
        svc = services.get(addr)
        if svc is None:
            return False
        self._service_slots[ctypes.c_uint32(svc.id)] = self._service_slots.Leaf()  # its flows stop here
        del self._services[self._service_key(addr)]
        self._vip_ref(addr.vip, -1)
        for bid, b in self._read_backends().items():
            if b.service == svc.id:
                self._clear_backend(bid)
        bit = 1 << svc.id
        for key, mask in list(self._backend_addrs.items()):
            if mask.value & bit:
                self._set_backend_addr(key, mask.value & ~bit)
        return True

    def _flow_backends(self, addr: ServiceAddress) -> set[tuple[int, int]]:
        """Backend addresses (map order) of the flows to addr without source NAT
        in the connection table: the established flows of a deleted service."""
        key = self._service_key(addr)
        return {(v.backend_ip, v.backend_port) for k, v in _items(self._flows)
                if k.dst == key.vip and k.dport == key.port and k.proto == key.proto and not v.snat_port}

    def _slot_value(self, addr: ServiceAddress):
        slot = self._service_slots.Leaf()
        key = self._service_key(addr)
        slot.vip, slot.port, slot.proto, slot.pad = key.vip, key.port, key.proto, SLOT_IN_USE
        return slot

    def _write_slot(self, service_id: int, addr: ServiceAddress) -> None:
        self._service_slots[ctypes.c_uint32(service_id)] = self._slot_value(addr)

    def _add_backend_addr(self, map_ip: int, map_port: int, service_id: int) -> None:
        key = self._backend_addrs.Key()
        key.ip, key.port = map_ip, map_port
        mask = self._backend_addrs.get(key)
        have = mask.value if mask is not None else 0
        if have & (1 << service_id):
            return
        try:
            self._set_backend_addr(key, have | (1 << service_id))
        except Exception:  # noqa: BLE001  BCC raises bare Exception; the map is full
            self._prune_backend_addrs()
            self._set_backend_addr(key, have | (1 << service_id))

    def _set_backend_addr(self, key, mask: int) -> None:
        if mask:
            self._backend_addrs[key] = self._backend_addrs.Leaf(mask)
        elif self._backend_addrs.get(key) is not None:
            del self._backend_addrs[key]

    def _prune_backend_addrs(self) -> None:
        """Full: forget addresses no longer in the service they served (their
        lingering flows lose the reply-path rewrite), keeping current backends."""
        current: dict[tuple[int, int], int] = {}
        for b in self._read_backends().values():
            current[(b.ip, b.port)] = current.get((b.ip, b.port), 0) | (1 << b.service)
        for key, mask in list(self._backend_addrs.items()):
            self._set_backend_addr(key, mask.value & current.get((key.ip, key.port), 0))

    def _filter_words(self) -> list[int]:
        words = [0] * (VIP_FILTER_BITS // 64)
        for key in self._vips:
            bit = vip_filter_bit(key.value)
            words[bit // 64] |= 1 << (bit % 64)
        return words

    def _write_vip_filter(self) -> None:
        entry = self._vip_filter.Leaf()
        for i, w in enumerate(self._filter_words()):
            entry.words[i] = w
        self._vip_filter[ctypes.c_uint32(0)] = entry

    def _write_backend(self, bid: int, key: str, state: BackendState, service_id: int) -> None:
        ip, port = parse_backend(key)
        entry = self._backends.Leaf()
        entry.ip = ip_to_map(ip)
        entry.port = port_to_map(port)
        entry.flags = BACKEND_IN_USE | (BACKEND_DRAINING if state.draining else 0) | (BACKEND_SNAT if state.snat else 0)
        entry.weight = state.weight
        entry.service = service_id
        self._backends[ctypes.c_uint32(bid)] = entry

    def _clear_backend(self, bid: int) -> None:
        self._backends[ctypes.c_uint32(bid)] = self._backends.Leaf()

    def _write_ring(self, ring_id: int, backend_ids: np.ndarray) -> None:
        ring = self._rings.Leaf()
        data = np.ascontiguousarray(backend_ids, dtype=np.uint32)
        ctypes.memmove(ctypes.addressof(ring), data.ctypes.data, data.nbytes)
        self._rings[ctypes.c_uint32(ring_id)] = ring

    def _vip_ref(self, vip: str, delta: int) -> None:
        key = self._vips.Key(ip_to_map(vip))
        count = self._vips.get(key)
        n = (count.value if count is not None else 0) + delta
        if n > 0:
            self._vips[key] = self._vips.Leaf(n)
        elif count is not None:
            del self._vips[key]
        self._write_vip_filter()  # set before a new VIP's first packet can matter, cleared after removal

    # -- views ----------------------------------------------------------------

    def _ring_counts(self, ring_id: int) -> np.ndarray:
        ring = self._rings[ctypes.c_uint32(ring_id)]
        data = np.frombuffer(bytes(ring), dtype=np.uint32, count=self.table_size)
        return np.bincount(data, minlength=MAX_BACKENDS)

    def _view(self, addr: ServiceAddress, svc, backends: dict[int, object]) -> ServiceView:
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
            ))
        views.sort(key=lambda v: v.address)
        return ServiceView(vip=addr.vip, port=addr.port, proto=addr.proto, active_ring=svc.active,
                           no_backends=no_backends, backends=views)

    def get_service(self, vip: str, port: int, proto: str) -> ServiceView | None:
        addr = service_address(vip, port, proto)
        svc = self._read_services().get(addr)
        if svc is None:
            return None
        return self._view(addr, svc, self._read_backends())

    def list_services(self) -> list[ServiceView]:
        backends = self._read_backends()
        return [self._view(addr, svc, backends) for addr, svc in sorted(self._read_services().items())]

    def verdict_counters(self) -> dict[str, int]:
        out = {}
        for verdict in Verdict:
            out[verdict.name.lower()] = int(sum(self._verdicts[ctypes.c_uint32(verdict.value)]))
        return out

    def close(self) -> None:
        """Drop this process's handles; pinned maps and attachments stay."""
        self._prog.bpf.cleanup()


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
