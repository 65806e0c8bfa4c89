"""Simulated fabric-agents for benchmarks: one helper process, one loopback port per agent.

Each port answers the calls the routing and reconcile loops make of an agent, and counts them:
PUT /v1/maglev/services (the batch push: every service "applied" at the generation sent, as an
agent with a dataplane answers), DELETE /v1/maglev/services/... (404: nothing there), GET /v1/vms
(none listed), GET /v1/health. The agents named silent accept connections and never answer (an agent
wedged, or a network that drops replies). ``ports[0]`` is the control port, no agent: GET
/sim/stats answers JSON with, for all agents together, the connections accepted, requests and
services received, and ``per_agent`` requests by port; GET /sim/held: each agent's service key ->
generation held (what its heartbeat reports); POST /sim/drop-idle as lab.rigs.loopback_http says.

``SimAgents(agents, silent)`` starts it (``python -m lab.rigs.sim_agents``); lab.rigs.scale uses it.
"""

from __future__ import annotations

import asyncio
import json
import sys
import urllib.request

from lab.rigs.loopback_http import HelperProcess, LoopbackServers


class Agents:
    def __init__(self, agents: int, silent: set[int]):
        self.silent_agents = silent  # indexes among the agents
        self.requests: dict[int, int] = {}
        self.services = 0
        self.held: dict[int, dict[str, int]] = {}  # agent port -> service key -> generation
        self.calls: dict[str, int] = {}
        self.servers = LoopbackServers(agents + 1, self.handle)

    async def handle(self, port: int, method: str, path: str, body: bytes) -> tuple[int, bytes] | None:
        self.control = self.servers.ports[0]
        agents = self.servers.ports[1:]
        if port == self.control and path.startswith("/sim/drop-idle"):
            self.servers.drop_idle()
            return 200, b"ok"
        if port == self.control and path.startswith("/sim/held"):
            return 200, json.dumps({str(p): h for p, h in self.held.items()}).encode()
        if port == self.control:
            return 200, json.dumps({
                "connections": sum(self.servers.connections.values()),  # less the controls: HelperProcess.stats
                "requests": sum(self.requests.values()), "services": self.services, "calls": self.calls,
                "per_agent": {str(p): self.requests.get(p, 0) for p in agents}}).encode()
        self.requests[port] = self.requests.get(port, 0) + 1
        kind = f"{method} {'/'.join(path.split('/')[:4])}"
        self.calls[kind] = self.calls.get(kind, 0) + 1
        if any(agents[i] == port for i in self.silent_agents):
            return None
        if method == "PUT" and path == "/v1/maglev/services":
            batch = json.loads(body)["services"]
            self.services += len(batch)
            held, results = self.held.setdefault(port, {}), []
            for s in batch:
                key = f"{s['vip']}:{s['port']}/{s.get('proto', 'tcp')}"
                held[key] = s["generation"]
                results.append({"key": key, "generation": s["generation"], "outcome": "applied", "held": s["generation"]})
            return 200, json.dumps({"results": results}).encode()
        if path.startswith("/v1/health"):
            return 200, b"{}"
        if method == "GET" and path == "/v1/vms":
            return 200, b'{"vms": []}'  # an agent whose engines run outside VMs it tracks
        return 404, json.dumps({"error": {"code": "not_found", "message": "nothing here"}}).encode()


class SimAgents(HelperProcess):
    """``SimAgents(agents, silent)``: ``ports[0]`` controls, ``ports[1:]`` are the agents; the
    agents whose indexes ``silent`` names never answer."""

    module = "lab.rigs.sim_agents"

    def __init__(self, agents: int, silent: frozenset[int] = frozenset()):
        super().__init__(agents + 1, ",".join(map(str, sorted(silent))) or "-")

    def held(self) -> dict[int, dict[str, int]]:
        self.control_connections += 1
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ports[0]}/sim/held", timeout=60) as resp:
            return {int(p): h for p, h in json.loads(resp.read()).items()}


if __name__ == "__main__":
    asyncio.run(Agents(int(sys.argv[1]) - 1,
                       {int(i) for i in sys.argv[2].split(",") if i.strip("-")}).servers.serve_forever())
