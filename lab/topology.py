"""The lab's network: namespaces and links that stand in for a GPU node and a client.

    host ns (untouched except our own veth and two routes through it)
      fl-host 10.246.0.1/30 ──veth── fl-up 10.246.0.2/30   [node ns: fabric-lab-node]
                                       XDP Maglev + TC reverse NAT on fl-up and fl-cli
      fabric-lab-client ns:            fl-br 10.244.0.1/24 bridge for replica namespaces
        eth0 10.245.0.2/30 ──veth──  fl-cli 10.245.0.1/30
        default via 10.245.0.1
    host routes: replica subnet and VIP pool via 10.246.0.2 dev fl-host

fabricd, the agent and the gateway run in the host namespace on loopback; the host link lets
the control plane probe replicas and the gateway reach the VIP (through the same XDP program)
or a replica. The host's own interfaces are never touched: the lab only adds its own veth.
`down` removes everything `up` made, by name, so a second `up` after a crash starts clean.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from agent.dataplane.veth import prepare_veth_end
from agent.vm.lab_engine import release_shm, shm_segments


@dataclass(frozen=True)
class LabTopology:
    prefix: str = "fabric-lab-"
    node_ns: str = "fabric-lab-node"
    client_ns: str = "fabric-lab-client"
    host_if: str = "fl-host"
    host_addr: str = "10.246.0.1"
    uplink_if: str = "fl-up"  # node side of the host link
    uplink_addr: str = "10.246.0.2"
    client_if: str = "fl-cli"  # node side of the client link
    client_gw: str = "10.245.0.1"
    client_addr: str = "10.245.0.2"
    bridge: str = "fl-br"
    bridge_addr: str = "10.244.0.1"
    replica_subnet: str = "10.244.0.0/24"
    vip_pool: str = "10.96.0.0/24"

    @property
    def xdp_ifaces(self) -> tuple[str, ...]:
        return (self.client_if, self.uplink_if)


def _run(cmd: list[str], check: bool = True) -> subprocess.CompletedProcess:
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if check and res.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed: {res.stderr.strip()}")
    return res


def netns_list() -> list[str]:
    return sorted(p.name for p in Path("/var/run/netns").glob("*")) if Path("/var/run/netns").exists() else []


def up(t: LabTopology) -> None:
    """Create the namespaces, links, addresses and routes (assumes down() ran first)."""
    ip = ["ip"]
    for ns in (t.node_ns, t.client_ns):
        _run(ip + ["netns", "add", ns])
        _run(ip + ["-n", ns, "link", "set", "lo", "up"])
    n = ip + ["-n", t.node_ns]
    _run(["ip", "netns", "exec", t.node_ns, "sysctl", "-qw", "net.ipv4.ip_forward=1"])
    # Replies from replicas leave through the same veth they came in on; rp_filter must not
    # drop the DNAT'd flows whose source is the client.
    _run(["ip", "netns", "exec", t.node_ns, "sysctl", "-qw", "net.ipv4.conf.all.rp_filter=0"])
    _run(["ip", "netns", "exec", t.node_ns, "sysctl", "-qw", "net.ipv4.conf.default.rp_filter=0"])
    # Bridge for replica namespaces.
    _run(n + ["link", "add", t.bridge, "type", "bridge"])
    _run(n + ["addr", "add", f"{t.bridge_addr}/{t.replica_subnet.split('/')[1]}", "dev", t.bridge])
    _run(n + ["link", "set", t.bridge, "up"])
    # Client link.
    _run(n + ["link", "add", t.client_if, "type", "veth", "peer", "name", "eth0", "netns", t.client_ns])
    _run(n + ["addr", "add", f"{t.client_gw}/30", "dev", t.client_if])
    _run(n + ["link", "set", t.client_if, "up"])
    c = ip + ["-n", t.client_ns]
    _run(c + ["addr", "add", f"{t.client_addr}/30", "dev", "eth0"])
    _run(c + ["link", "set", "eth0", "up"])
    _run(c + ["route", "add", "default", "via", t.client_gw])
    # Host link: our own veth, never the host's interfaces.
    _run(ip + ["link", "add", t.host_if, "type", "veth", "peer", "name", t.uplink_if, "netns", t.node_ns])
    _run(ip + ["addr", "add", f"{t.host_addr}/30", "dev", t.host_if])
    _run(ip + ["link", "set", t.host_if, "up"])
    _run(n + ["addr", "add", f"{t.uplink_addr}/30", "dev", t.uplink_if])
    _run(n + ["link", "set", t.uplink_if, "up"])
    for dst in (t.replica_subnet, t.vip_pool):
        _run(ip + ["route", "replace", dst, "via", t.uplink_addr, "dev", t.host_if])
    # The XDP program forwards by redirect into these veths (docs/dataplane.md "Forwarding"):
    # their far ends run GRO (NAPI) and send complete checksums. fl-host is the lab's own veth.
    prepare_veth_end(t.client_ns, "eth0")
    prepare_veth_end(None, t.host_if)
    # The node answers for the VIP pool towards the client (XDP rewrites before routing, but
    # the client needs a route to the pool: its default route covers it).


def down(t: LabTopology) -> list[str]:
    """Remove every namespace with the lab prefix and the host veth; returns what was removed."""
    removed = []
    for ns in netns_list():
        if ns.startswith(t.prefix):
            pids = _run(["ip", "netns", "pids", ns], check=False).stdout.split()
            shm = shm_segments(pids)  # a real vLLM engine's shared memory, which SIGKILL leaves
            for pid in pids:
                _run(["kill", "-9", pid], check=False)
            _run(["ip", "netns", "del", ns], check=False)
            if shm and _wait_gone(pids):  # unlinked only once no process of it maps them
                release_shm(shm)
            removed.append(f"netns {ns}")
    if _run(["ip", "link", "show", t.host_if], check=False).returncode == 0:
        _run(["ip", "link", "del", t.host_if], check=False)
        removed.append(f"link {t.host_if}")
    for dst in (t.replica_subnet, t.vip_pool):
        _run(["ip", "route", "del", dst], check=False)
    return removed


def _wait_gone(pids: list[str], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(Path(f"/proc/{p}").exists() for p in pids):
            return True
        time.sleep(0.05)
    return False


def leftovers(t: LabTopology) -> list[str]:
    """What of the lab still exists (for `lab status` and the e2e test's final check)."""
    out = [f"netns {ns}" for ns in netns_list() if ns.startswith(t.prefix)]
    if _run(["ip", "link", "show", t.host_if], check=False).returncode == 0:
        out.append(f"link {t.host_if}")
    return out
