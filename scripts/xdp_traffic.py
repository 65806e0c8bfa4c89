"""Real traffic through the XDP dataplane, for scripts/bench-xdp: the same
namespaces as the dataplane tests (tests/dataplane/dataplane_nslab.py: a
client, a node, a backend b1 behind the node's bridge), each figure measured
client -> VIP -> backend and client -> backend directly (the same path with
the programs detached), interleaved, median of ROUNDS.

    tcp_4_streams_up / _down   iperf3 -P 4 (down: -R, the backend sends: an LLM response)
    new_connections_per_s      a bounded Python generator: connect, wait for the server's close
    udp_1_flow_pps             iperf3 -u, one flow of 64-byte datagrams, packets received per second
    dsr_down                   iperf3 -R -P 4 through a dsr-ipip VIP (replies bypass the node's
                               programs) vs the NAT VIP, and the packets the node's programs handled
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "dataplane"))

from dataplane_nslab import NODE_IP, VIP, NsLab

from agent.dataplane import Dataplane
from agent.dataplane.decap import enable_dsr_backend
from tests.support.bpf import new_pin_dir

BACKEND = "10.1.0.11"
DSR_VIP = "10.9.0.101"
IPERF_PORT = 5201
# direct and VIP connections go to different server ports: the server's TIME_WAIT entries of one
# run would otherwise meet the other run's SYNs (same client ports, other timestamps) and stall them
CONN_PORTS = {"direct": 7000, "vip": 7001}

SINK = r"""
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(4096)
while True:
    c, _ = s.accept(); c.close()
"""

CONNECT = r"""
import socket, sys, time
host, port, secs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
n, end = 0, time.monotonic() + secs
start = time.monotonic()
while time.monotonic() < end:
    c = socket.create_connection((host, port), timeout=5)
    c.recv(1)  # the server's FIN: the handshake and the close went both ways
    c.close()
    n += 1
print(n / (time.monotonic() - start))
"""


def _iperf(lab: NsLab, target: str, secs: float, *extra: str) -> dict:
    out = subprocess.run(["ip", "netns", "exec", lab.client, "iperf3", "-c", target, "-p", str(IPERF_PORT),
                          "-t", str(secs), "-J", *extra], capture_output=True, text=True, timeout=secs + 60)
    result = json.loads(out.stdout)
    if "error" in result:
        raise RuntimeError(f"iperf3 {' '.join(extra)} to {target}: {result['error']}")
    return result["end"]


def tcp_bps(lab: NsLab, target: str, secs: float, down: bool) -> float:
    end = _iperf(lab, target, secs, "-P", "4", *(["-R"] if down else []))
    return end["sum_received"]["bits_per_second"]


def udp_pps(lab: NsLab, target: str, secs: float) -> float:
    s = _iperf(lab, target, secs, "-u", "-b", "0", "-l", "64")["sum"]
    return (s["packets"] - s["lost_packets"]) / s["seconds"]


def conn_rate(lab: NsLab, target: str, port: int, secs: float) -> float:
    out = subprocess.run(["ip", "netns", "exec", lab.client, sys.executable, "-c", CONNECT, target, str(port),
                          str(secs)], capture_output=True, text=True, timeout=secs + 60, check=True)
    return float(out.stdout)


def run(rounds: int = 3, secs: float = 3.0) -> dict:
    lab = NsLab(backends=1)
    pin_dir = new_pin_dir()
    procs = []
    dp = None
    try:
        lab.build()
        for args in (["iperf3", "-s", "-p", str(IPERF_PORT)], *([sys.executable, "-c", SINK, str(port)]
                                                                for port in CONN_PORTS.values())):
            procs.append(subprocess.Popen(["ip", "netns", "exec", lab.ns("b1"), *args], stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL))
        time.sleep(1)
        dp = Dataplane(pin_dir=pin_dir, node_ip=NODE_IP, route_netns=lab.node, flow_entries=262144)
        for port, proto in ((IPERF_PORT, "tcp"), (IPERF_PORT, "udp"), (CONN_PORTS["vip"], "tcp")):
            dp.put_service(VIP, port, proto, {f"{BACKEND}:{port}": 1})
        enable_dsr_backend(lab.ns("b1"), "eth0", BACKEND, [DSR_VIP])
        for port, proto in ((IPERF_PORT, "tcp"), (IPERF_PORT, "udp")):
            dp.put_service(DSR_VIP, port, proto, {f"{BACKEND}:{port}": 1}, forwarding="dsr-ipip")

        def attach(on: bool) -> None:
            for iface in ("ni", "nr"):
                (dp.attach if on else dp.detach)(iface, lab.node)

        def handled() -> int:
            """Packets the node's programs translated or encapsulated (both directions)."""
            v = dp.verdict_counters()
            return sum(v[k] for k in ("fwd_new_flow", "fwd_established", "fwd_miss_recorded", "fwd_untracked",
                                      "tc_reply", "reply_snat"))

        figures: dict[str, list[float]] = {}

        def add(name: str, value: float) -> None:
            figures.setdefault(name, []).append(value)

        for _ in range(rounds):
            for mode, target in (("direct", BACKEND), ("vip", VIP)):
                attach(mode == "vip")
                add(f"tcp_4_streams_up_{mode}_bps", tcp_bps(lab, target, secs, down=False))
                add(f"tcp_4_streams_down_{mode}_bps", tcp_bps(lab, target, secs, down=True))
                add(f"new_connections_per_s_{mode}", conn_rate(lab, target, CONN_PORTS[mode], secs))
                add(f"udp_1_flow_pps_{mode}", udp_pps(lab, target, secs))
            attach(True)
            for mode, target in (("nat", VIP), ("dsr", DSR_VIP)):
                before = handled()
                bps = tcp_bps(lab, target, secs, down=True)
                add(f"dsr_down_{mode}_bps", bps)
                add(f"dsr_down_{mode}_lb_packets_per_gbit", (handled() - before) / (bps * secs / 1e9))
        med = {k: statistics.median(v) for k, v in figures.items()}
        out = {k: round(v) for k, v in med.items()}
        for name in ("tcp_4_streams_up", "tcp_4_streams_down", "new_connections_per_s", "udp_1_flow_pps"):
            direct = name + ("_direct_bps" if name.startswith("tcp") else "_direct")
            vip = name + ("_vip_bps" if name.startswith("tcp") else "_vip")
            out[f"{name}_ratio"] = round(med[vip] / med[direct], 3)
        out["dsr_down_ratio_to_nat"] = round(med["dsr_down_dsr_bps"] / med["dsr_down_nat_bps"], 3)
        out["rounds"], out["secs"] = rounds, secs
        return out
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=10)
        if dp is not None:
            dp.close()  # the attachments go with the namespaces below
        lab.close()
        shutil.rmtree(pin_dir, ignore_errors=True)


if __name__ == "__main__":
    print(json.dumps(run(rounds=int(sys.argv[1]) if len(sys.argv) > 1 else 1,
                         secs=float(sys.argv[2]) if len(sys.argv) > 2 else 2.0)))
