"""The agent's handle on the XDP Maglev dataplane: load, attach, update services.

Invariants:
* All state lives in pinned maps (loader.py); a new Dataplane on the same
  pin_dir sees exactly what the previous process left, so `put_service` with an
  unchanged backend set is a no-op after a restart too. Pins are reused only
  when their layout record matches (pins.py).
* One writer at a time: every map change runs under the pin directory's lock
  (pins.writer_lock), whichever process or thread makes it.
* node_ip and the flow settings are written by `attach` or `configure` only.
* A service's Maglev table is written into its inactive ring, then one update of
  the service entry switches `active`: packets see the old or the new table,
  never a half-written one.
* Weight-0 and draining backends take no new flows; their established flows
  continue. A backend removed from the service loses its flows to a re-pick.
* Derived maps the fast paths read instead of hash lookups, kept in step here:
  `vip_filter` (bitmap of hashed VIP addresses, rebuilt from `vips`),
  `service_slots` (service id -> its VIP:port/proto while it exists) and
  `backend_addrs` (backend IP:port -> mask of the service ids it belongs to).
  `_sync_derived` adds what they lack on open.
* A backend or service id that is reused starts from zero counters.
"""

from __future__ import annotations

import ctypes
import ipaddress
import logging
from collections.abc import Iterable, Mapping

import numpy as np

from agent.dataplane import attach as attach_mod
from agent.dataplane import egress as egress_mod
from agent.dataplane.addresses import (
    ServiceAddress,
    ip_from_map,
    ip_to_map,
    parse_backend,
    parse_ipv4,
    port_to_map,
    service_address,
)
from agent.dataplane.fibwatch import FibWatch
from agent.dataplane.loader import (
    MAX_BACKENDS,
    MAX_SERVICES,
    Layout,
    default_flow_entries,
    ensure_pin_dir,
    load,
    map_memory_bytes,
)
from agent.dataplane.maglev import MAX_WEIGHT, build_maglev_indices
from agent.dataplane.pinned import open_pinned
from agent.dataplane.pins import check_layout, read_meta, writer_lock
from agent.dataplane.plan import FORWARDING_MODES, BackendState, allocate_ids, plan_service
from agent.dataplane.reading import (
    BACKEND_DRAINING,
    BACKEND_IN_USE,
    BACKEND_SNAT,
    SERVICE_DSR,
    SERVICE_NO_BACKENDS,
    MapReader,
)
from agent.dataplane.verdicts import Xmit
from agent.settings import DataplaneSettings
from common.errors import Conflict, InvalidInput

log = logging.getLogger(__name__)

SLOT_IN_USE = 1
CONFIG_XDP_FORWARD = 1  # maps.h
DEFAULT_TABLE_SIZE = 65537
# vip_filter in dataplane/bpf/maps.h
VIP_FILTER_BITS = 4096
VIP_FILTER_MULT = 0x9E3779B1
VIP_FILTER_SHIFT = 20


# the pins this class opens (dataplane/bpf/maps.h)
MAP_NAMES = ["services", "vips", "rings", "backends", "backend_stats", "verdict_stats", "config", "meta",
             "vip_filter", "service_slots", "backend_addrs", "flows", "reverse_flows", "flow_misses",
             "egress_devs", "bridge_ports", "xmit_stats", "fib_gen"]


def vip_filter_bit(map_ip: int) -> int:
    """The filter bit of a VIP, as xdp_maglev computes it from the address in network order."""
    return ((map_ip * VIP_FILTER_MULT) & 0xFFFFFFFF) >> VIP_FILTER_SHIFT


class Dataplane(MapReader):
    def __init__(self, pin_dir: str = "/sys/fs/bpf/fabric", node_ip: str | None = None,
                 table_size: int | None = None, *, flow_entries: int | None = None,
                 route_netns: str | None = None, settings: DataplaneSettings | None = None,
                 percpu_lru: bool = True, percpu_full: bool = True, programs: bool = True):
        """Load the programs, creating or re-opening the pinned maps under pin_dir.

        table_size / flow_entries: the sizes to create the maps with (defaults
        65537 and loader.default_flow_entries(), the flows each CPU's list
        holds); existing pins keep theirs, and naming
        other sizes than they have is refused. node_ip and settings are what
        `attach` writes; opening the maps writes neither.
        route_netns: the namespace whose routes tell local (bridge) backends from
        routed ones that need source NAT, and whose addresses no VIP may take;
        defaults to the namespace of the last attach, else the agent's own.
        programs=False: only the maps are wanted (the CLI's show/set/delete):
        existing pins are opened as they are, without compiling (pinned.py);
        `attach` then refuses. Absent pins are created by compiling as before.
        """
        self.node_ip = parse_ipv4(node_ip, "node_ip") if node_ip else None
        self.settings = settings or DataplaneSettings()
        self._route_netns = route_netns
        self.pin_dir = pin_dir
        ensure_pin_dir(pin_dir)
        with writer_lock(pin_dir):
            have = read_meta(pin_dir)
            layout = Layout(table_size=table_size or (have.table_size if have else DEFAULT_TABLE_SIZE),
                            flow_entries=flow_entries or (have.flow_entries if have else default_flow_entries()),
                            percpu_lru=percpu_lru, percpu_full=percpu_full)
            if have is not None:
                check_layout(pin_dir, have, layout.meta)
            self._prog = None
            maps = open_pinned(pin_dir, MAP_NAMES) if have is not None and not programs else None
            if maps is None:
                self._prog = load(pin_dir, layout)
                maps = self._prog.bpf
            self._maps = maps
            self.table_size = layout.table_size
            self.flow_entries = layout.flow_entries
            bpf = maps  # table names as bytes: BCC warns on str
            self._services = bpf[b"services"]
            self._vips = bpf[b"vips"]
            self._rings = bpf[b"rings"]
            self._backends = bpf[b"backends"]
            self._backend_stats = bpf[b"backend_stats"]
            self._verdicts = bpf[b"verdict_stats"]
            self._config = bpf[b"config"]
            self._meta = bpf[b"meta"]
            self._vip_filter = bpf[b"vip_filter"]
            self._service_slots = bpf[b"service_slots"]
            self._backend_addrs = bpf[b"backend_addrs"]
            self._flows = bpf[b"flows"]
            self._reverse = bpf[b"reverse_flows"]
            self._misses = bpf[b"flow_misses"]
            self._egress_devs = bpf[b"egress_devs"]
            self._bridge_ports = bpf[b"bridge_ports"]
            self._xmit = bpf[b"xmit_stats"]
            self._fib_gen = bpf[b"fib_gen"]
            self._fib_watch: FibWatch | None = None
            if have is None:
                self._write_meta(layout)
            self._sync_derived()

    # -- config and attachment ------------------------------------------------

    def _write_meta(self, layout: Layout) -> None:
        meta = layout.meta
        entry = self._meta.Leaf()
        for name in meta.__dataclass_fields__:
            setattr(entry, name, getattr(meta, name))
        self._meta[ctypes.c_uint32(0)] = entry

    def configure(self, *, node_ip: str | None = None, settings: DataplaneSettings | None = None) -> None:
        """Write node-wide settings into the live config map (an explicit setting)."""
        with writer_lock(self.pin_dir):
            key = ctypes.c_uint32(0)
            cfg = self._config[key]
            cfg.table_size = self.table_size
            if node_ip is not None:
                self.node_ip = parse_ipv4(node_ip, "node_ip")
                cfg.node_ip = ip_to_map(self.node_ip)
            if settings is not None:
                self.settings = settings
                cfg.udp_flow_secs = settings.udp_flow_secs
                cfg.miss_inserts = settings.miss_inserts
                cfg.flags = CONFIG_XDP_FORWARD if settings.xdp_forward else 0
            self._config[key] = cfg
            self._write_vip_filter()  # node_ip's bit
            self._bump_fib_gen()

    def live_node_ip(self) -> str | None:
        value = self._config[ctypes.c_uint32(0)].node_ip
        return ip_from_map(value) if value else None

    def flow_table_bytes(self) -> int:
        """Kernel memory of the two flow tables (forward and reverse)."""
        return map_memory_bytes(self._flows) + map_memory_bytes(self._reverse)

    def attach(self, iface: str, netns: str | None = None) -> None:
        """Write node_ip and the settings, then attach (XDP replaced in one step,
        the TC filter replaced in place)."""
        if self._prog is None:
            raise Conflict("this handle opened the maps only (programs=False): open one with the programs to attach")
        self.configure(node_ip=self.node_ip, settings=self.settings)
        with writer_lock(self.pin_dir):
            attach_mod.attach_programs(iface, netns, self._prog.xdp, self._prog.tc.fd,
                                       source_nat=bool(self.live_node_ip()))
            # replies of local backends enter through the bridges: translated and redirected there
            attach_mod.attach_bridge_ingress(netns, self._prog.tc_reply.fd)
        if self._route_netns is None:
            self._route_netns = netns
        with writer_lock(self.pin_dir):
            self._refresh_egress()
        if self._fib_watch is None:
            self._fib_watch = FibWatch(self._route_netns, self._routing_changed)
            self._fib_watch.start()
        log.info("dataplane attached to %s%s: flow tables %d entries per CPU x 2, %.1f MiB of kernel memory",
                 iface, f" in {netns}" if netns else "", self.flow_entries, self.flow_table_bytes() / 2**20)

    def detach(self, iface: str, netns: str | None = None) -> None:
        attach_mod.detach_programs(iface, netns)
        attach_mod.detach_bridge_ingress(netns)

    def forwarding(self) -> bool:
        """Whether the live config forwards in BPF (FABRIC_XDP_FORWARD at attach)."""
        return bool(self._config[ctypes.c_uint32(0)].flags & CONFIG_XDP_FORWARD)

    def refresh_egress(self) -> None:
        """Re-read the devices and bridge FDB of the attached namespace into
        egress_devs / bridge_ports (egress.py); also done by attach and every put_service that changed the maps."""
        with writer_lock(self.pin_dir):
            self._refresh_egress()

    def _routing_changed(self, devices: bool) -> None:
        """FibWatch: routes or neighbours changed (devices: links or FDB too), or its period passed."""
        with writer_lock(self.pin_dir):
            if devices:
                self._refresh_egress()
            else:
                self._bump_fib_gen()

    def bump_fib_gen(self) -> None:
        """Invalidate every cached forwarding decision (fib_cache) on every CPU."""
        with writer_lock(self.pin_dir):
            self._bump_fib_gen()

    def _bump_fib_gen(self) -> None:
        key = ctypes.c_uint32(0)
        gen = (self._fib_gen[key].value + 1) & 0xFFFFFFFF
        self._fib_gen[key] = ctypes.c_uint32(gen or 1)  # 0 would turn the cache off

    def _refresh_egress(self) -> None:
        self._bump_fib_gen()  # the decisions cached from the old snapshot go with it
        if not self.forwarding():
            return
        plan = egress_mod.plan_egress(*egress_mod.read_namespace(self._route_netns))
        want_devs = {k: v for k, v in plan.devices.items()}
        for key in list(self._egress_devs.keys()):
            if key.value not in want_devs:
                del self._egress_devs[key]
        for ifindex, kind in want_devs.items():
            self._egress_devs[ctypes.c_uint32(ifindex)] = ctypes.c_uint32(kind)
        want_ports = {}
        for (bridge, mac), port in plan.ports.items():
            key = self._bridge_ports.Key()
            key.bridge = bridge
            ctypes.memmove(key.mac, egress_mod.mac_bytes(mac), 6)
            want_ports[bytes(key)] = (key, port)
        for key in list(self._bridge_ports.keys()):
            if bytes(key) not in want_ports:
                del self._bridge_ports[key]
        for key, port in want_ports.values():
            self._bridge_ports[key] = ctypes.c_uint32(port)

    def xmit_counters(self) -> dict[str, int]:
        """How translated packets left the node (Xmit codes), summed over CPUs."""
        return {x.name.lower(): int(sum(self._xmit[ctypes.c_uint32(x.value)])) for x in Xmit}

    @property
    def xdp_fd(self) -> int:
        if self._prog is None:
            raise Conflict("this handle opened the maps only (programs=False)")
        return self._prog.xdp.fd

    def _sync_derived(self) -> None:
        """Add to vip_filter, service_slots and backend_addrs whatever the services
        and backends need and they lack (a crash between two writes). Only adds,
        and writes nothing when all is there. The caller holds the writer lock."""
        services = self._read_services()
        for addr, svc in services.items():
            want = self._slot_value(addr)
            if bytes(self._service_slots[ctypes.c_uint32(svc.id)]) != bytes(want):
                self._service_slots[ctypes.c_uint32(svc.id)] = want
        live = {svc.id for svc in services.values()}
        for b in self._read_backends().values():
            if b.service in live:
                self._set_member(b.ip, b.port, b.service, True)
        have = self._vip_filter[ctypes.c_uint32(0)]
        need = self._filter_words()
        if any(have.words[i] & w != w for i, w in enumerate(need)):
            for i, w in enumerate(need):
                have.words[i] |= w
            self._vip_filter[ctypes.c_uint32(0)] = have

    # -- updates --------------------------------------------------------------

    def _wanted(self, backends: Mapping[str, int], draining: Iterable[str], addr: ServiceAddress,
                forwarding: str) -> dict[str, BackendState]:
        if forwarding not in FORWARDING_MODES:
            raise InvalidInput(f"forwarding must be one of {', '.join(FORWARDING_MODES)}, got {forwarding!r}")
        dsr = forwarding == "dsr-ipip"
        draining = {f"{ip}:{port}" for ip, port in (parse_backend(d) for d in draining)}
        wanted = {}
        node_ip = None if dsr else self.live_node_ip()  # DSR backends answer clients themselves: no SNAT
        for text, weight in backends.items():
            ip, port = parse_backend(text)
            if not isinstance(weight, int) or isinstance(weight, bool) or not 0 <= weight <= MAX_WEIGHT:
                raise InvalidInput(f"weight of backend {ip}:{port} must be an integer 0-{MAX_WEIGHT}, got {weight!r}")
            key = f"{ip}:{port}"
            if dsr and port != addr.port:
                raise InvalidInput(f"backend {key}: forwarding dsr-ipip keeps the VIP's port (the backend answers "
                                   f"from {addr.vip}:{addr.port} itself), so its port must be {addr.port}")
            snat = bool(node_ip) and not attach_mod.route_is_via_bridge(ip, self._route_netns)
            wanted[key] = BackendState(weight=weight, draining=key in draining, snat=snat)
        return wanted

    def _refuse_node_address(self, addr: ServiceAddress) -> None:
        """A VIP that is one of the node's own addresses would capture the node's
        traffic on that port (SSH, the agent): refused."""
        own = set(attach_mod.node_addresses(self._route_netns))
        if self.live_node_ip():
            own.add(self.live_node_ip())
        if addr.vip in own or ipaddress.IPv4Address(addr.vip).is_loopback:
            raise InvalidInput(f"VIP {addr.vip} is an address of this node: a service there would take the "
                               "node's own traffic; choose an address the node does not hold")

    def put_service(self, vip: str, port: int, proto: str, backends: Mapping[str, int],
                    draining: Iterable[str] = (), forwarding: str = "nat") -> bool:
        """Create or update a service; True if the maps changed. forwarding: "nat"
        (DNAT, replies translated back here) or "dsr-ipip" (encapsulated to the
        backend, which owns the VIP and answers the client directly); flows
        keep the mode they were picked with."""
        addr = service_address(vip, port, proto)
        self._refuse_node_address(addr)
        with writer_lock(self.pin_dir):
            changed = self._put_service(addr, self._wanted(backends, draining, addr, forwarding), forwarding)
            if changed:  # a new backend's MAC may have appeared behind a bridge; later ones reach FibWatch
                self._refresh_egress()
            return changed

    def _put_service(self, addr: ServiceAddress, wanted: dict[str, BackendState], forwarding: str = "nat") -> bool:
        services = self._read_services()
        all_backends = self._read_backends()
        existing = services.get(addr)
        current = self._service_state(existing, all_backends) if existing is not None else None
        plan = plan_service(current, wanted, forwarding)
        if not plan.changed:
            return False

        if current is None:
            try:
                service_id = allocate_ids({s.id for s in services.values()}, 1, MAX_SERVICES)[0]
            except ValueError:
                raise Conflict(f"no room for another service (limit {MAX_SERVICES})") from None
            active = 1  # so the first table goes to ring 0
            self._misses[ctypes.c_uint32(service_id)] = self._misses.Leaf()  # a reused id starts at zero
        else:
            service_id, active = current.service_id, current.active
        try:
            new_ids = allocate_ids(set(all_backends), len(plan.add), MAX_BACKENDS)
        except ValueError:
            raise Conflict(f"no room for {len(plan.add)} more backends (limit {MAX_BACKENDS})") from None
        for bid in new_ids:  # a reused id starts at zero
            self._backend_stats[ctypes.c_uint32(bid)] = self._backend_stats.Leaf()
        ids = dict(plan.keep) | dict(zip(plan.add, new_ids))
        for key, bid in ids.items():
            self._write_backend(bid, key, wanted[key], service_id)
            ip, port = parse_backend(key)
            self._set_member(ip_to_map(ip), port_to_map(port), service_id, True)

        inactive = 1 - active
        if not plan.no_backends:
            keys, table = build_maglev_indices(plan.table_weights, self.table_size)
            backend_ids = np.asarray([ids[k] for k in keys], dtype=np.uint32)[table]
            self._write_ring(service_id * 2 + inactive, backend_ids)
        if current is None:
            self._write_slot(service_id, addr)
        entry = self._services.Leaf()
        entry.id = service_id
        entry.active = inactive if not plan.no_backends else active
        entry.flags = (SERVICE_NO_BACKENDS if plan.no_backends else 0) | (SERVICE_DSR if forwarding == "dsr-ipip" else 0)
        self._services[self._service_key(addr)] = entry  # the switch: one map update
        if current is None:
            self._vip_ref(addr.vip, +1)
        for key, bid in current.backend_ids.items() if current else ():
            if bid in plan.free:  # removed: its flows are picked again from now on
                ip, port = parse_backend(key)
                self._set_member(ip_to_map(ip), port_to_map(port), service_id, False)
                self._clear_backend(bid)
        return True

    def readiness(self) -> list[tuple[str, int, str, int, int]]:
        """(vip, port, proto, backends that take new flows, backends) per service: two map
        reads, no flow-table scan, cheap enough for a loop (agent/bgp announces from it)."""
        services = self._read_services()
        backends = self._read_backends()
        out = []
        for addr, svc in services.items():
            state = self._service_state(svc, backends)
            ready = sum(1 for b in state.backends.values() if b.weight > 0 and not b.draining)
            out.append((addr.vip, addr.port, addr.proto, 0 if state.no_backends else ready, len(state.backends)))
        return out

    def xdp_attached(self, iface: str, netns: str | None = None) -> bool:
        return attach_mod.xdp_attached(iface, netns)

    def delete_service(self, vip: str, port: int, proto: str) -> bool:
        addr = service_address(vip, port, proto)
        with writer_lock(self.pin_dir):
            svc = self._read_services().get(addr)
            if svc is None:
                return False
            self._service_slots[ctypes.c_uint32(svc.id)] = self._service_slots.Leaf()  # its flows stop here
            del self._services[self._service_key(addr)]
            self._vip_ref(addr.vip, -1)
            for bid, b in self._read_backends().items():
                if b.service == svc.id:
                    self._set_member(b.ip, b.port, svc.id, False)
                    self._clear_backend(bid)
            return True

    def _slot_value(self, addr: ServiceAddress):
        slot = self._service_slots.Leaf()
        key = self._service_key(addr)
        slot.vip, slot.port, slot.proto, slot.pad = key.vip, key.port, key.proto, SLOT_IN_USE
        return slot

    def _write_slot(self, service_id: int, addr: ServiceAddress) -> None:
        self._service_slots[ctypes.c_uint32(service_id)] = self._slot_value(addr)

    def _set_member(self, map_ip: int, map_port: int, service_id: int, member: bool) -> None:
        """Set or clear service_id's bit on a backend address in backend_addrs."""
        key = self._backend_addrs.Key()
        key.ip, key.port = map_ip, map_port
        mask = self._backend_addrs.get(key)
        have = mask.value if mask is not None else 0
        want = have | (1 << service_id) if member else have & ~(1 << service_id)
        if want == have and (mask is not None or not want):
            return
        if want:
            self._backend_addrs[key] = self._backend_addrs.Leaf(want)
        else:
            del self._backend_addrs[key]

    def _filter_words(self) -> list[int]:
        """The VIPs' bits and node_ip's (its source-NAT replies are translated in XDP)."""
        words = [0] * (VIP_FILTER_BITS // 64)
        node_ip = self._config[ctypes.c_uint32(0)].node_ip
        for value in [key.value for key in self._vips] + ([node_ip] if node_ip else []):
            bit = vip_filter_bit(value)
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

    def close(self) -> None:
        """Drop this process's handles; pinned maps and attachments stay."""
        if self._fib_watch is not None:
            self._fib_watch.stop()
            self._fib_watch = None
        self._maps.cleanup()

