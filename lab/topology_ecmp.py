"""The two-balancer lab's network: a router that learns each VIP from both balancer nodes over BGP,
and optionally GPU hosts without the balancer role (``gpu_hosts``) whose replicas the balancers
reach through the router.

    fabric-ecmp-client                     fabric-ecmp-router (BIRD, AS 65000)
      eth0 10.251.0.2/30 ──veth── rcli 10.251.0.1/30    fib_multipath_hash_policy=1 (5-tuple)
      default via 10.251.0.1           rn1 10.250.1.1/30 ──veth── eu0 10.250.1.2/30  fabric-ecmp-n1
                                       rn2 10.250.2.1/30 ──veth── eu0 10.250.2.2/30  fabric-ecmp-n2
      router: 10.252.N.0/24 via node N (static), VIP /32s from BGP with one next hop per node

    node N (its own fabric-agent, XDP Maglev on eu0, BIRD AS 65001 speaking to the router):
      ebr 10.252.N.1/24 bridge ── replicas fabric-ecmp-nNrM at 10.252.N.(10+M), default via 10.252.N.1
      default via 10.250.N.1

    GPU hosts are numbered after the balancers (node 3 with two balancers) and wired the same
    way, but the router has no BGP session with them: no VIP is routed there, only their
    replica subnet (static).

Every namespace has the prefix `fabric-ecmp-`; the host namespace is not touched at all (the
agents run there and reach their nodes only through setns). `down` removes every namespace with
the prefix (and with it every veth, XDP attachment and the processes inside).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from agent.dataplane.veth import prepare_veth_end

ROUTER_ASN = 65000
NODE_ASN = 65001


@dataclass(frozen=True)
class EcmpTopology:
    prefix: str = "fabric-ecmp-"
    nodes: int = 2  # balancer nodes, numbered from 1
    gpu_hosts: int = 0  # nodes without the balancer role, numbered after them
    replicas_per_node: int = 2
    uplink: str = "eu0"  # node side of the router link (XDP here)
    bridge: str = "ebr"
    vip_pool: str = "10.97.0.0/24"

    @property
    def router_ns(self) -> str:
        return f"{self.prefix}router"

    @property
    def client_ns(self) -> str:
        return f"{self.prefix}client"

    client_addr: str = "10.251.0.2"
    client_gw: str = "10.251.0.1"

    def node_numbers(self) -> range:
        """Every node, balancers first."""
        return range(1, self.nodes + self.gpu_hosts + 1)

    def balancer(self, n: int) -> bool:
        return n <= self.nodes

    def node_ns(self, n: int) -> str:
        return f"{self.prefix}n{n}"

    def node_addr(self, n: int) -> str:
        return f"10.250.{n}.2"

    def router_addr(self, n: int) -> str:
        """The router's address on node n's link (the node's BGP peer)."""
        return f"10.250.{n}.1"

    def router_if(self, n: int) -> str:
        return f"rn{n}"

    def replica_subnet(self, n: int) -> str:
        return f"10.252.{n}.0/24"

    def bridge_addr(self, n: int) -> str:
        return f"10.252.{n}.1"

    def replica_ns(self, n: int, m: int) -> str:
        return f"{self.prefix}n{n}r{m}"

    def replica_addr(self, n: int, m: int) -> str:
        return f"10.252.{n}.{10 + m}"

    def replicas(self) -> list[tuple[int, int]]:
        return [(n, m) for n in self.node_numbers() for m in range(1, self.replicas_per_node + 1)]

    def namespaces(self) -> list[str]:
        return ([self.router_ns, self.client_ns] + [self.node_ns(n) for n in self.node_numbers()]
                + [self.replica_ns(n, m) for n, m in self.replicas()])


def _run(cmd: list[str], check: bool = True) -> subprocess.CompletedProcess:
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if check and res.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed: {res.stderr.strip()}")
    return res


def _sysctl(ns: str, *settings: str) -> None:
    _run(["ip", "netns", "exec", ns, "sysctl", "-qw", *settings])


def _veth(a_ns: str, a_if: str, a_addr: str, b_ns: str, b_if: str, b_addr: str, plen: int = 30) -> None:
    _run(["ip", "-n", a_ns, "link", "add", a_if, "type", "veth", "peer", "name", b_if, "netns", b_ns])
    for ns, dev, addr in ((a_ns, a_if, a_addr), (b_ns, b_if, b_addr)):
        if addr:
            _run(["ip", "-n", ns, "addr", "add", f"{addr}/{plen}", "dev", dev])
        _run(["ip", "-n", ns, "link", "set", dev, "up"])


def netns_list() -> list[str]:
    root = Path("/var/run/netns")
    return sorted(p.name for p in root.glob("*")) if root.exists() else []


def up(t: EcmpTopology) -> None:
    """Create the namespaces, links, addresses and routes (after down())."""
    for ns in t.namespaces():
        _run(["ip", "netns", "add", ns])
        _run(["ip", "-n", ns, "link", "set", "lo", "up"])
    r = t.router_ns
    _sysctl(r, "net.ipv4.ip_forward=1", "net.ipv4.fib_multipath_hash_policy=1",
            "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0")
    _veth(r, "rcli", t.client_gw, t.client_ns, "eth0", t.client_addr)
    _run(["ip", "-n", t.client_ns, "route", "add", "default", "via", t.client_gw])
    prepare_veth_end(t.client_ns, "eth0")
    for n in t.node_numbers():
        ns = t.node_ns(n)
        _sysctl(ns, "net.ipv4.ip_forward=1", "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0")
        _veth(r, t.router_if(n), t.router_addr(n), ns, t.uplink, t.node_addr(n))
        # XDP on eu0 redirects into rnN (and the replicas' veths): their far ends run NAPI/GRO
        prepare_veth_end(r, t.router_if(n))
        _run(["ip", "-n", ns, "route", "add", "default", "via", t.router_addr(n)])
        _run(["ip", "-n", r, "route", "add", t.replica_subnet(n), "via", t.node_addr(n)])
        _run(["ip", "-n", ns, "link", "add", t.bridge, "type", "bridge"])
        _run(["ip", "-n", ns, "addr", "add", f"{t.bridge_addr(n)}/24", "dev", t.bridge])
        _run(["ip", "-n", ns, "link", "set", t.bridge, "up"])
        for m in range(1, t.replicas_per_node + 1):
            rns, port = t.replica_ns(n, m), f"ep{m}"
            _run(["ip", "-n", ns, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", rns])
            _run(["ip", "-n", ns, "link", "set", port, "master", t.bridge])
            _run(["ip", "-n", ns, "link", "set", port, "up"])
            _run(["ip", "-n", rns, "addr", "add", f"{t.replica_addr(n, m)}/24", "dev", "eth0"])
            _run(["ip", "-n", rns, "link", "set", "eth0", "up"])
            _run(["ip", "-n", rns, "route", "add", "default", "via", t.bridge_addr(n)])
            prepare_veth_end(rns, "eth0")


def down(t: EcmpTopology) -> list[str]:
    """Kill what runs in the lab's namespaces and delete them; returns what was removed."""
    removed = []
    for ns in netns_list():
        if ns.startswith(t.prefix):
            for pid in _run(["ip", "netns", "pids", ns], check=False).stdout.split():
                _run(["kill", "-9", pid], check=False)
            _run(["ip", "netns", "del", ns], check=False)
            removed.append(f"netns {ns}")
    return removed


def leftovers(t: EcmpTopology) -> list[str]:
    return [f"netns {ns}" for ns in netns_list() if ns.startswith(t.prefix)]


def router_bird_config(t: EcmpTopology, hold_secs: int, bfd: bool, log_path: str) -> str:
    """The router's BIRD: one session per node, every learned /32 installed in the kernel with one
    next hop per node (merge paths: ECMP)."""
    lines = [
        f'log "{log_path}" all;',
        f"router id {t.client_gw};",
        'timeformat protocol "%s";',
        "protocol device { scan time 2; }",
        "protocol kernel {",
        "  ipv4 { import none; export all; };",
        "  merge paths yes limit 16;",
        "  learn off;",
        "}",
    ]
    if bfd:
        lines += ["protocol bfd {",
                  '  interface "rn*" { min rx interval 100 ms; min tx interval 100 ms; multiplier 3; };',
                  "}"]
    lines += [
        "template bgp nodes {",
        f"  local as {ROUTER_ASN};",
        f"  hold time {hold_secs};",
        f"  keepalive time {max(1, hold_secs // 3)};",
        "  connect retry time 1;",
        "  error wait time 1, 4;",
        f"  bfd {'on' if bfd else 'off'};",
        "  ipv4 { import all; export none; };",
        "}",
    ]
    for n in range(1, t.nodes + 1):
        lines.append(f"protocol bgp node{n} from nodes {{ neighbor {t.node_addr(n)} as {NODE_ASN}; }}")
    return "\n".join(lines) + "\n"


def vip_next_hops(t: EcmpTopology, vip: str) -> list[str]:
    """The next hops the router's kernel holds for vip/32 (`ip route` in the router namespace)."""
    out = _run(["ip", "-n", t.router_ns, "-4", "route", "show", "exact", f"{vip}/32"], check=False).stdout
    hops = []
    words = out.split()
    for i, w in enumerate(words):
        if w == "via" and i + 1 < len(words):
            hops.append(words[i + 1])
    return sorted(hops)
