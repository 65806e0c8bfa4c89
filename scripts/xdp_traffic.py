"""Real traffic through the XDP dataplane, for scripts/bench-xdp: the same
namespaces as the dataplane tests (tests/dataplane/dataplane_nslab.py: a
client, a node, a backend b1 behind the node's bridge), each figure measured
client -> VIP -> backend and client -> backend directly (the same path with
the programs detached).

Trusting it on a shared 2-core host: each round measures both modes back to back
(direct then VIP in even rounds, VIP then direct in odd ones, so neither always
runs second), and each figure's ratio is the median of the per-round ratios VIP
/ direct (a neighbour's burst moves one pair, not the answer), reported with its
spread (`*_ratio_min` / `_max`, every round in `*_ratios`) and the load average
before and after. More, shorter rounds beat fewer long ones here: the box's load
changes on the scale of seconds. iperf3 3.12 runs whole seconds (`-t` is an integer).

    tcp_4_streams_up / _down   iperf3 -P 4 (down: -R, the backend sends: an LLM response)
    new_connections_per_s      a bounded Python generator: connect, wait for the server's close
    udp_1_flow_pps             iperf3 -u, one flow of 64-byte datagrams, packets received per second
    dsr_down                   iperf3 -R -P 4 through a dsr-ipip VIP (replies bypass the node's
                               programs) vs the NAT VIP, and the packets the node's programs handled
"""

from __future__ import annotations

import json
import os
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
from lab.rigs.bpf import new_pin_dir

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


FIGURES = ("tcp_4_streams_up", "tcp_4_streams_down", "new_connections_per_s", "udp_1_flow_pps")


def _ratios(vip: list[float], base: list[float]) -> dict:
    """Per-round ratios vip / base (the same round's pair), their median and spread."""
    ratios = [round(v / b, 3) for v, b in zip(vip, base)]
    return {"ratio": round(statistics.median(ratios), 3), "ratio_min": min(ratios), "ratio_max": max(ratios),
            "ratios": ratios}


def summarize(figures: dict[str, list[float]]) -> dict:
    """Medians of every figure (rounded) and, per figure, the per-round ratio's median and spread."""
    out: dict = {}
    for key, values in figures.items():
        name = key + ("_bps" if key.startswith("tcp") or key in ("dsr_down_nat", "dsr_down_dsr") else "")
        out[name] = round(statistics.median(values))
    for name in FIGURES:
        for k, v in _ratios(figures[f"{name}_vip"], figures[f"{name}_direct"]).items():
            out[f"{name}_{k}"] = v
    for k, v in _ratios(figures["dsr_down_dsr"], figures["dsr_down_nat"]).items():
        out[f"dsr_down_{k}_to_nat"] = v
    return out


def run(rounds: int = 6, secs: float = 2.0) -> dict:
    secs = max(1, round(secs))  # iperf3 runs whole seconds; the per-Gbit figure divides by the same
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

        def measure(name: str, mode: str, target: str) -> float:
            if name == "tcp_4_streams_up":
                return tcp_bps(lab, target, secs, down=False)
            if name == "tcp_4_streams_down":
                return tcp_bps(lab, target, secs, down=True)
            if name == "new_connections_per_s":
                return conn_rate(lab, target, CONN_PORTS[mode], secs)
            return udp_pps(lab, target, secs)

        load_before = os.getloadavg()[0]
        for r in range(rounds):
            order = (("direct", BACKEND), ("vip", VIP))
            for mode, target in order if r % 2 == 0 else order[::-1]:
                attach(mode == "vip")
                for name in FIGURES:
                    add(f"{name}_{mode}", measure(name, mode, target))
            attach(True)
            for mode, target in (("nat", VIP), ("dsr", DSR_VIP)) if r % 2 == 0 else (("dsr", DSR_VIP), ("nat", VIP)):
                before = handled()
                bps = tcp_bps(lab, target, secs, down=True)
                add(f"dsr_down_{mode}", bps)
                add(f"dsr_down_{mode}_lb_packets_per_gbit", (handled() - before) / (bps * secs / 1e9))
        out = summarize(figures)
        out["rounds"], out["secs"] = rounds, secs
        out["load_average_before"], out["load_average_after"] = round(load_before, 2), round(os.getloadavg()[0], 2)
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
    print(json.dumps(run(rounds=int(sys.argv[1]) if len(sys.argv) > 1 else 2,
                         secs=float(sys.argv[2]) if len(sys.argv) > 2 else 2.0)))
