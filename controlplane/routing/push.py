"""Pushing published plans to agents: once, on change, batched, never behind the slowest agent.

Each pass hands ``Pushes.push`` the online nodes and the service of every published plan
(common.records.plans) by its key ``VIP:PORT/PROTO``. Only balancer nodes (``Node.balancer``, an
admin's role: docs/dataplane.md) carry services; a GPU host without the role needs nothing pushed
for its own replicas (the balancer that picks a nat flow keeps its reverse entry and source-NATs
to its own address, and a dsr-ipip replica decapsulates with the VIPs its VM was created with).
A node that is not a balancer but holds services of this pass (it lost the role, or the agent
kept them from before) has each DELETEd through its own queue (``held``), so a role change
moves the services on the next pass. A balancer is sent, in one PUT /v1/maglev/services, exactly
the services ``due`` names: those whose generation it has not acknowledged, and those its latest heartbeat
(newer than the acknowledgement) reports at another generation -- an agent restart, a fail-closed
withdrawal or a hand edit shows there, and only that service goes again. Nothing is re-sent on
a timer: an unchanged plan costs no request.

Each agent has its own queue: at most one request in flight per agent. The pass waits for the
requests it started at most ``deadline_s``; an agent that has not answered by then (it accepted
the connection and never answered, say) is marked silent and its request is left running on its
own. While marked it is never waited for again: a pass starts its next request only once the
previous one ended, in the background, and the first answer clears the mark. So one silent agent
delays no other agent's weights, and a pass waits on it once. A node that is deleted takes its
queue with it (``keep_only``, every pass).

An agent without a dataplane answers 400 (Refused) and counts as holding what it was sent, so it
is not asked again until the plan moves. A failure is kept per agent and shown in the endpoint's
status (``notes``) until a later push succeeds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from common.agent_api import MaglevServicePut
from common.errors import FabricError, Refused
from common.schemas import Node

log = logging.getLogger("fabricd.routing.push")
PUSH_DEADLINE_S = 5.0  # how long a pass waits for an agent's answer before marking it silent


@dataclass
class AgentPushes:
    """One agent's queue: what it acknowledged, its request in flight, why it last failed."""

    acked: dict[str, tuple[int, float]] = field(default_factory=dict)  # key -> (generation, when acknowledged)
    task: asyncio.Task | None = None
    silent_since: float | None = None
    failure: str = ""
    failed_keys: set[str] = field(default_factory=set)
    removed: dict[str, float] = field(default_factory=dict)  # key -> when its DELETE succeeded (not a balancer)

    @property
    def busy(self) -> bool:
        return self.task is not None and not self.task.done()


def due(wanted: Mapping[str, int], acked: Mapping[str, tuple[int, float]], reported: Mapping[str, int],
        reported_at: float) -> list[str]:
    """Pure: the service keys one agent must be sent. ``wanted``: key -> the plan's generation;
    ``acked``: what the agent answered holding, and when; ``reported``/``reported_at``: its last
    heartbeat's generations and that heartbeat's time."""
    out = []
    for key, generation in wanted.items():
        have = acked.get(key)
        if have is None or have[0] != generation:
            out.append(key)
        elif reported_at > have[1] and reported.get(key) != generation:
            out.append(key)  # the agent lost it (restart, withdrawal, hand edit) since it acknowledged
    return sorted(out)


def held(wanted: Mapping[str, int], acked: Mapping[str, tuple[int, float]], reported: Mapping[str, int],
         reported_at: float, removed: Mapping[str, float]) -> list[str]:
    """Pure: the service keys a node that is not a balancer must have removed: those of this pass it
    acknowledged, and those its heartbeat reports unless that heartbeat is older than the removal."""
    out = []
    for key in wanted:
        if key in acked or (key in reported and reported_at > removed.get(key, float("-inf"))):
            out.append(key)
    return sorted(out)


def service_address(key: str) -> tuple[str, int, str]:
    """(vip, port, proto) of a key ``VIP:PORT/PROTO``."""
    address, _, proto = key.partition("/")
    vip, _, port = address.rpartition(":")
    return vip, int(port), proto


class Pushes:
    def __init__(self, agents, clock: Callable[[], float], *, deadline_s: float = PUSH_DEADLINE_S, metrics=None):
        self.agents = agents
        self.clock = clock
        self.deadline_s = deadline_s
        self.metrics = metrics
        self.by_node: dict[str, AgentPushes] = {}
        self.sent = 0  # services sent, all passes (bench-scale and tests read it)
        self.requests = 0
        self.withdrawn = 0  # services removed from nodes that are not balancers, all passes
        self.waited: list[str] = []  # the agents the last pass waited for
        self._troubled: list[str] = []  # agents silent or with a failed key after the last push (notes)

    def of(self, node_id: str) -> AgentPushes:
        return self.by_node.setdefault(node_id, AgentPushes())

    def forget(self) -> None:
        """Acknowledgements are no longer trusted (another leader ran): compare with the heartbeats
        again. Requests in flight keep running."""
        for state in self.by_node.values():
            state.acked.clear()
            state.removed.clear()

    def keep_only(self, registered: Iterable[str]) -> None:
        """Forget the queues of nodes no longer registered (deleted): their acknowledgements, and a
        request of theirs still out is cancelled, so a removed silent agent is no longer named in
        every endpoint's status, and the queues do not grow with every node the fleet ever had."""
        keep = set(registered)
        for node_id in [n for n in self.by_node if n not in keep]:
            task = self.by_node.pop(node_id).task
            if task is not None:
                task.cancel()
        self._troubled = [n for n in self._troubled if n in keep]

    def drop(self, key: str) -> None:
        """A service that left every agent: forget its acknowledgements."""
        for state in self.by_node.values():
            state.acked.pop(key, None)
            state.failed_keys.discard(key)

    def silent(self, node_id: str) -> bool:
        state = self.by_node.get(node_id)
        return state is not None and state.silent_since is not None

    def may_hold(self, node: Node, key: str) -> bool:
        """Whether ``node`` may hold the service ``key``: every balancer, and any node that
        acknowledged it or reports it (endpoint deletion asks these only)."""
        state = self.by_node.get(node.id)
        return node.balancer or key in node.service_generations or (state is not None and key in state.acked)

    def notes(self, key: str) -> list[str]:
        """Why agents do not hold this service as published (for the endpoint's status). Asks only
        the agents that were silent or failing after the last push (indexed once per pass, so the
        endpoints' statuses cost O(endpoints x those), not O(endpoints x nodes))."""
        out = []
        for node_id in self._troubled:
            state = self.by_node[node_id]
            if state.silent_since is not None:
                out.append(f"agent {node_id} silent (no answer within {self.deadline_s:g}s); skipped until it answers")
            elif key in state.failed_keys and state.failure:
                out.append(f"Maglev push to {node_id} failed: {state.failure}")
        return out

    async def push(self, nodes: Iterable[Node], services: Mapping[str, MaglevServicePut]) -> None:
        """One pass over the online ``nodes``: start each balancer's batch and each former holder's
        removals, wait for the answers up to the deadline."""
        wanted = {key: s.generation for key, s in services.items()}
        waited: dict[str, asyncio.Task] = {}
        for node in nodes:
            if node.balancer:
                state = self.of(node.id)
                keys = due(wanted, state.acked, node.service_generations, node.last_heartbeat)
            else:
                found = self.by_node.get(node.id)
                keys = held(wanted, found.acked if found else {}, node.service_generations, node.last_heartbeat,
                            found.removed if found else {})
                state = self.of(node.id) if keys else AgentPushes()
            if not keys or state.busy:
                continue  # nothing moved, or its previous request is still out (its own queue)
            if node.balancer:
                batch = [services[k] for k in keys]
                work = self._send(node, state, batch)
                self.sent += len(batch)
            else:
                work = self._withdraw(node, state, keys)
                self.withdrawn += len(keys)
            state.task = asyncio.create_task(work, name=f"maglev-push-{node.id}")
            self.requests += 1
            if state.silent_since is None:
                waited[node.id] = state.task
        self.waited = sorted(waited)
        try:
            if not waited:
                return
            done, _ = await asyncio.wait(waited.values(), timeout=self.deadline_s)
            now = self.clock()
            for node_id, task in waited.items():
                if task not in done:
                    state = self.of(node_id)
                    state.silent_since = now
                    log.warning("agent %s did not answer its Maglev push within %gs: marked silent, not waited "
                                "for until it answers", node_id, self.deadline_s)
            for task in done:
                task.result()  # a bug in _send surfaces here; agents' failures were recorded
        finally:
            self._troubled = sorted(node_id for node_id, state in self.by_node.items()
                                    if state.silent_since is not None or state.failed_keys)

    async def _withdraw(self, node: Node, state: AgentPushes, keys: list[str]) -> None:
        """DELETE each of ``keys`` on a node that is not a balancer (404 and no dataplane: absent)."""
        client = self.agents.for_node(node)
        for key in keys:
            try:
                await client.delete_service(*service_address(key))
            except Refused:
                pass  # no dataplane there: nothing to remove
            except FabricError as exc:
                state.failure = f"removing {key} (not a balancer): {exc.message}"
                state.failed_keys.add(key)
                return
            state.acked.pop(key, None)
            state.removed[key] = self.clock()
            state.failed_keys.discard(key)
        state.silent_since, state.failure = None, ""

    async def _send(self, node: Node, state: AgentPushes, batch: list[MaglevServicePut]) -> None:
        keys = {s.key for s in batch}
        try:
            result = await self.agents.for_node(node).put_services(batch)
        except Refused:  # no dataplane on that agent: it holds nothing, and is not asked again until a change
            now = self.clock()
            for s in batch:
                state.acked[s.key] = (s.generation, now)
            state.silent_since, state.failure = None, ""
            state.failed_keys -= keys
            return
        except FabricError as exc:
            state.failure = exc.message
            state.failed_keys |= keys
            return
        now = self.clock()
        state.silent_since = None
        state.failed_keys -= keys
        state.failure = ""
        for r in result.results:
            if r.outcome == "failed":
                state.failed_keys.add(r.key)
                state.failure = f"{r.key}: {r.message}"
                continue
            # applied, or stale (the agent holds a newer generation than this pass: it keeps that)
            state.acked[r.key] = (r.held, now)
        if self.metrics:
            self.metrics.maglev_pushes.inc(len(batch))
