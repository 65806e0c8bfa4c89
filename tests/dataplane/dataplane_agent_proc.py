"""Stand-in agent for the namespace tests: owns a Dataplane, attaches it, and
applies JSON-line commands from stdin (put/delete/counters), one reply per line.

    argv: pin_dir node_ip node_netns iface...
"""

from __future__ import annotations

import json
import sys

from agent.dataplane import Dataplane


def main() -> None:
    pin_dir, node_ip, netns, *ifaces = sys.argv[1:]
    dp = Dataplane(pin_dir=pin_dir, node_ip=node_ip, route_netns=netns, flow_entries=65536)
    for iface in ifaces:
        dp.attach(iface, netns)
    ops = {
        "ping": lambda: "pong",
        "put": lambda port, backends, draining=(), forwarding="nat": dp.put_service(
            "10.9.0.100", port, "tcp", backends, draining, forwarding),
        "delete": lambda port: dp.delete_service("10.9.0.100", port, "tcp"),
        "verdicts": dp.verdict_counters,
        "xmit": dp.xmit_counters,
        "detach": lambda: [dp.detach(i, netns) for i in ifaces],
    }
    for line in sys.stdin:
        request = json.loads(line)
        try:
            reply = {"ok": ops[request["op"]](*request["args"])}
        except Exception as exc:  # noqa: BLE001  reported to the test, which fails on it
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
