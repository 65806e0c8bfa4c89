"""`fabric-lab ecmp up|down|status`: two balancer nodes behind a BGP router, in namespaces.

Each node runs its own `fabric-agent` (the production code: dry-run VM driver, the XDP Maglev
program on its uplink, BIRD announcing the VIPs it can serve, FABRIC_BGP_*) and its own replicas
(lab/ecmp_replica.py) on its bridge; the router namespace runs BIRD that peers with
both nodes and installs each VIP with one next hop per node (ECMP, 5-tuple hash); the client sits
behind the router (topology_ecmp.py). `--gpu-hosts N` adds nodes without the balancer role: their
agents run without BGP, and their replicas are backends the balancers reach through the router.
`up` pushes two services with fabricd's own push code (controlplane.routing.push, over the
agents' API) to the nodes as fabricd's records would hold them (``lab_nodes``), so only the
balancers get them: a dsr-ipip VIP and a nat VIP with every replica as a backend. There is no
fabricd here: the lab is about the path a VIP client takes.

Faults for tests and benches: `kill_agent` (SIGKILL: BIRD dies with it, the router withdraws
when the session closes), `silence_node` (the router drops everything to and from the node, as
if it lost power: the route goes at the hold timer or BFD), `restore_node`.
State lives in $FABRIC_LAB_STATE/ecmp or /var/lib/fabric/lab-ecmp; `down` leaves nothing.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from common.agent_api import MaglevServicePut
from common.schemas import Node
from controlplane.agent_client import AgentClients
from controlplane.routing.push import Pushes
from lab import processes
from lab.topology_ecmp import (
    NODE_ASN,
    ROUTER_ASN,
    EcmpTopology,
    router_bird_config,
    vip_next_hops,
)
from lab.topology_ecmp import down as topo_down
from lab.topology_ecmp import leftovers as topo_leftovers
from lab.topology_ecmp import up as topo_up

DSR_VIP = "10.97.0.10"
NAT_VIP = "10.97.0.11"
VIP_PORT = 80
PIN_PREFIX = "/sys/fs/bpf/fabric-ecmp-n"


def ecmp_state_dir() -> Path:
    base = os.environ.get("FABRIC_LAB_STATE")
    return (Path(base) / "ecmp") if base else Path("/var/lib/fabric/lab-ecmp")


@dataclass(frozen=True)
class EcmpConfig:
    state_dir: Path
    topology: EcmpTopology = field(default_factory=EcmpTopology)
    hold_secs: int = 3
    bfd: bool = False
    agent_base_port: int = 9510  # node N's agent API on 127.0.0.1:(base + N)
    flow_entries: int = 65536

    def agent_url(self, n: int) -> str:
        return f"http://127.0.0.1:{self.agent_base_port + n}"

    def pin_dir(self, n: int) -> str:
        return f"{PIN_PREFIX}{n}"

    @property
    def router_dir(self) -> Path:
        return self.state_dir / "router"

    def backends(self) -> dict[str, int]:
        t = self.topology
        return {f"{t.replica_addr(n, m)}:{VIP_PORT}": 1 for n, m in t.replicas()}


def _say(echo: Callable[[str], None] | None, msg: str) -> None:
    if echo:
        echo(msg)


def _http(method: str, url: str, body: dict | None = None, timeout: float = 10.0) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
            return resp.status, (json.loads(raw) if raw else {})
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            return exc.code, json.loads(raw)
        except ValueError:
            return exc.code, {"raw": raw.decode(errors="replace")}


def agent_command(cfg: EcmpConfig, n: int) -> list[str]:
    t = cfg.topology
    return [processes.bin_path("fabric-agent"), "serve", "--node-id", f"ecmp-n{n}",
            "--listen", f"127.0.0.1:{cfg.agent_base_port + n}", "--insecure", "--vm-driver", "dry-run",
            "--fake-gpus", "1", "--state-dir", str(cfg.state_dir / f"agent-n{n}"), "--pin-dir", cfg.pin_dir(n),
            "--dataplane-iface", t.uplink, "--dataplane-netns", t.node_ns(n), "--node-ip", t.node_addr(n),
            "--flow-entries", str(cfg.flow_entries), "--log-level", "info"]


def agent_env(cfg: EcmpConfig, n: int) -> dict[str, str]:
    t = cfg.topology
    if not t.balancer(n):  # a GPU host without the role speaks no BGP
        return {"FABRIC_XDP_FORWARD": "0"}
    return {"FABRIC_BGP": "1", "FABRIC_BGP_LOCAL_ASN": str(NODE_ASN),
            "FABRIC_BGP_PEERS": f"{t.router_addr(n)}:{ROUTER_ASN}", "FABRIC_BGP_ROUTER_ID": t.node_addr(n),
            "FABRIC_BGP_HOLD_SECS": str(cfg.hold_secs), "FABRIC_BGP_BFD": "1" if cfg.bfd else "0",
            "FABRIC_BGP_COMMUNITIES": f"{ROUTER_ASN}:{n}",
            # A flow whose backend is behind the other node leaves by the link it came in on; XDP_TX
            # back into the router's veth delivers nothing on this kernel (the frame is counted on the
            # router's end and never reaches its stack), so translated packets take the kernel's
            # forwarding path here (docs/dataplane.md, "Announcing VIPs").
            "FABRIC_XDP_FORWARD": "0"}


def start_agent(cfg: EcmpConfig, n: int) -> int:
    return processes.start(cfg.state_dir, f"agent-n{n}", agent_command(cfg, n), agent_env(cfg, n))


def agent_pid(cfg: EcmpConfig, n: int) -> int | None:
    try:
        return int((cfg.state_dir / "pids" / f"agent-n{n}.pid").read_text())
    except (OSError, ValueError):
        return None


def wait_agent(cfg: EcmpConfig, n: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        pid = agent_pid(cfg, n)
        if pid is not None and not processes.alive(pid):
            raise RuntimeError(f"agent n{n} exited; see {cfg.state_dir / 'logs' / f'agent-n{n}.log'}")
        try:
            code, body = _http("GET", cfg.agent_url(n) + "/v1/health", timeout=2)
            if code == 200 and body.get("dataplane"):
                return
            last = str(body)
        except OSError as exc:
            last = str(exc)
        time.sleep(0.3)
    raise RuntimeError(f"agent n{n} not ready within {timeout:.0f} s: {last}")


def lab_nodes(cfg: EcmpConfig) -> dict[int, Node]:
    """The lab's nodes as fabricd's records would hold them (online, balancer or not)."""
    t = cfg.topology
    return {n: Node(id=f"ecmp-n{n}", address=cfg.agent_url(n), balancer=t.balancer(n), last_heartbeat=time.time())
            for n in t.node_numbers()}


def put_services(cfg: EcmpConfig, nodes: list[int] | None = None, backends: dict[str, int] | None = None
                 ) -> list[str]:
    """The same two services with the same backends and weights, pushed by fabricd's push code to
    ``nodes`` (default: every node; only the balancers get them); the node ids it sent to."""
    backends = cfg.backends() if backends is None else backends
    services = {s.key: s for s in (MaglevServicePut(vip=vip, port=VIP_PORT, proto="tcp", backends=backends,
                                                    forwarding=mode)
                                   for vip, mode in ((DSR_VIP, "dsr-ipip"), (NAT_VIP, "nat")))}
    targets = [node for n, node in lab_nodes(cfg).items() if nodes is None or n in nodes]

    async def push() -> Pushes:
        agents = AgentClients(cfg.state_dir, insecure=True)
        pushes = Pushes(agents, time.time)
        try:
            await pushes.push(targets, services)
        finally:
            await agents.aclose()
        return pushes

    pushes = asyncio.run(push())
    failed = [note for key in services for note in pushes.notes(key)]
    if failed:
        raise RuntimeError("; ".join(failed))
    return sorted(pushes.by_node)


def delete_service(cfg: EcmpConfig, vip: str, nodes: list[int] | None = None) -> None:
    for n in nodes or range(1, cfg.topology.nodes + 1):
        _http("DELETE", f"{cfg.agent_url(n)}/v1/maglev/services/{vip}/{VIP_PORT}/tcp")


def held_services(cfg: EcmpConfig, n: int) -> list[str]:
    """The VIPs of the services node n's dataplane holds (its agent's GET /v1/maglev/services)."""
    code, body = _http("GET", cfg.agent_url(n) + "/v1/maglev/services", timeout=5)
    if code != 200:
        raise RuntimeError(f"agent n{n}: GET /v1/maglev/services answered {code} {body}")
    return sorted(s["vip"] for s in body.get("services", []))


def bgp_status(cfg: EcmpConfig, n: int) -> dict:
    return _http("GET", cfg.agent_url(n) + "/v1/bgp", timeout=5)[1]


def next_hops(cfg: EcmpConfig, vip: str) -> list[str]:
    return vip_next_hops(cfg.topology, vip)


def wait_next_hops(cfg: EcmpConfig, vip: str, want: list[str], timeout: float = 30.0) -> float:
    """Seconds until the router holds exactly `want` as vip's next hops."""
    start = time.monotonic()
    while True:
        if next_hops(cfg, vip) == sorted(want):
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise RuntimeError(f"router: {vip} has next hops {next_hops(cfg, vip)}, expected {sorted(want)} "
                               f"after {timeout:.0f} s")
        time.sleep(0.05)


def node_hops(cfg: EcmpConfig, nodes: list[int] | None = None) -> list[str]:
    return sorted(cfg.topology.node_addr(n) for n in (nodes or range(1, cfg.topology.nodes + 1)))


def _start_router(cfg: EcmpConfig) -> None:
    rd = cfg.router_dir
    rd.mkdir(parents=True, exist_ok=True)
    conf = rd / "bird.conf"
    conf.write_text(router_bird_config(cfg.topology, cfg.hold_secs, cfg.bfd, str(rd / "bird.log")))
    sock = rd / "bird.ctl"
    processes.start(cfg.state_dir, "router-bird", ["ip", "netns", "exec", cfg.topology.router_ns, "bird", "-f",
                                                   "-c", str(conf), "-s", str(sock)], {})


def router_birdc(cfg: EcmpConfig, *args: str) -> str:
    res = subprocess.run(["birdc", "-s", str(cfg.router_dir / "bird.ctl"), *args], capture_output=True, text=True,
                         timeout=10)
    return res.stdout


def _start_replicas(cfg: EcmpConfig, echo) -> None:
    from agent.dataplane.decap import enable_dsr_backend

    t = cfg.topology
    for n, m in t.replicas():
        name = f"n{n}r{m}"
        processes.start(cfg.state_dir, f"replica-{name}", [
            "ip", "netns", "exec", t.replica_ns(n, m), sys.executable, "-m", "lab.ecmp_replica",
            "serve", "--name", name, "--port", str(VIP_PORT)], {"PYTHONPATH": str(Path(__file__).resolve().parents[1])})
        _say(echo, f"lab ecmp: replica {name} at {t.replica_addr(n, m)} (dsr-ipip decap for {DSR_VIP})")
        enable_dsr_backend(t.replica_ns(n, m), "eth0", t.replica_addr(n, m), [DSR_VIP])


def up(cfg: EcmpConfig, echo: Callable[[str], None] | None = None) -> None:
    """Clean, then build everything; returns once the router holds both VIPs via every node."""
    down(cfg)
    t = cfg.topology
    cfg.state_dir.mkdir(parents=True, exist_ok=True)
    _say(echo, f"lab ecmp: namespaces (router, client, {t.nodes} nodes, {len(t.replicas())} replicas)")
    topo_up(t)
    _say(echo, f"lab ecmp: router BIRD (AS {ROUTER_ASN}, hold {cfg.hold_secs} s{', BFD' if cfg.bfd else ''})")
    _start_router(cfg)
    for n in t.node_numbers():
        role = f"BGP AS {NODE_ASN}" if t.balancer(n) else "a GPU host: not a balancer, no BGP"
        _say(echo, f"lab ecmp: fabric-agent n{n} (XDP on {t.node_ns(n)}/{t.uplink}, {role})")
        start_agent(cfg, n)
    _start_replicas(cfg, echo)
    for n in t.node_numbers():
        wait_agent(cfg, n)
    put_services(cfg)
    for vip in (DSR_VIP, NAT_VIP):
        wait_next_hops(cfg, vip, node_hops(cfg))
    _say(echo, f"lab ecmp: {DSR_VIP}:80 (dsr-ipip) and {NAT_VIP}:80 (nat) via {', '.join(node_hops(cfg))}")


def down(cfg: EcmpConfig) -> list[str]:
    """Stop the agents (they withdraw and close their sessions), the router and the replicas, then
    remove the namespaces and the pinned maps; returns what was removed."""
    removed = [f"process {pid}" for pid in processes.stop_all(cfg.state_dir)]
    removed += topo_down(cfg.topology)
    for pins in pin_dirs():
        shutil.rmtree(pins, ignore_errors=True)
        removed.append(f"pins {pins}")
    return removed


def pin_dirs() -> list[str]:
    """Every node's pin directory there is (whatever the topology of the lab that made them)."""
    return sorted(str(p) for p in Path(PIN_PREFIX).parent.glob(Path(PIN_PREFIX).name + "*") if p.is_dir())


def status(cfg: EcmpConfig) -> list[str]:
    """What of the lab exists."""
    out = topo_leftovers(cfg.topology)
    out += [f"process {pid}" for pid in processes.running(cfg.state_dir)]
    out += [f"pins {pins}" for pins in pin_dirs()]
    return out


# -- faults -------------------------------------------------------------------------------

def kill_agent(cfg: EcmpConfig, n: int) -> None:
    pid = agent_pid(cfg, n)
    if pid is None:
        raise RuntimeError(f"no pid for agent n{n}")
    os.kill(pid, signal.SIGKILL)


def _router_iptables(cfg: EcmpConfig, op: str, n: int) -> None:
    dev = cfg.topology.router_if(n)
    rules = [["INPUT", "-i", dev], ["OUTPUT", "-o", dev], ["FORWARD", "-o", dev, "-d", cfg.topology.vip_pool]]
    for rule in rules:
        subprocess.run(["ip", "netns", "exec", cfg.topology.router_ns, "iptables", op, *rule, "-j", "DROP"],
                       check=op == "-A", capture_output=True, timeout=10)


def silence_node(cfg: EcmpConfig, n: int) -> None:
    """Node n's balancer goes silent (a hung or powered-off balancer): the router hears nothing
    from it, sends it nothing, and VIP packets routed to it are lost, so its BGP session ends at
    the hold timer (or BFD). Traffic to its replicas still passes: they stand for backends on
    hosts of their own, which the routing controller, not BGP, takes out of the tables."""
    _router_iptables(cfg, "-A", n)


def restore_node(cfg: EcmpConfig, n: int) -> None:
    _router_iptables(cfg, "-D", n)


# -- the client ---------------------------------------------------------------------------

def client_socket(cfg: EcmpConfig, vip: str, timeout: float = 2.0) -> socket.socket:
    """A TCP connection from the client namespace to vip:80 (a new source port each time)."""
    from agent.dataplane.netns import run_in_netns

    def body() -> socket.socket:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(timeout)
        try:
            s.connect((vip, VIP_PORT))
        except OSError:
            s.close()
            raise
        return s

    return run_in_netns(cfg.topology.client_ns, body)


def ask(sock: socket.socket, line: str = "next") -> str:
    """Send one line, return the replica name that answered (raises OSError when broken)."""
    sock.sendall(line.encode() + b"\n")
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(256)
        if not chunk:
            raise ConnectionResetError("closed by the far end")
        data += chunk
    name, _, echoed = data.decode().strip().partition(" ")
    if echoed != line:
        raise ConnectionError(f"answer {data!r} does not echo {line!r}")
    return name


def one_request(cfg: EcmpConfig, vip: str, timeout: float = 1.0) -> str | None:
    """A new connection, one line, closed: the replica's name, or None when it failed."""
    try:
        s = client_socket(cfg, vip, timeout)
    except OSError:
        return None
    try:
        return ask(s)
    except OSError:
        return None
    finally:
        s.close()


def node_packets(cfg: EcmpConfig, n: int, vip: str) -> int:
    """Packets node n's XDP program sent to vip's backends (its own counters, read over its API)."""
    code, body = _http("GET", f"{cfg.agent_url(n)}/v1/maglev/services/{vip}/{VIP_PORT}/tcp", timeout=5)
    if code != 200:
        return 0
    return sum(int(b.get("packets", 0)) for b in body.get("stats", []))
