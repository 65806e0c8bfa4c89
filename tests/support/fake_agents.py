"""The agent pool fabricd's workers push to, for tests: one fake agent per node."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class FakeAgents:
    """Stands where fabricd passes its `AgentClients` (reconcile, routing, the leader's fencing).

    `for_node(node)` answers the agent `make(self)` built the first time that node was asked for, and
    the same agent afterwards (`by_node`, by node id; a test may seat its own agents there). `calls`
    is one list every agent may record into, in order across nodes. Anything else the test's agents
    share (an event to release, counters) is given as keywords and kept as attributes of the pool.
    """

    def __init__(self, make: Callable[[FakeAgents], Any], **shared: Any):
        self.make = make
        self.calls: list = []
        self.by_node: dict[str, Any] = {}
        self.__dict__.update(shared)

    def for_node(self, node) -> Any:
        if node.id not in self.by_node:
            self.by_node[node.id] = self.make(self)
        return self.by_node[node.id]
