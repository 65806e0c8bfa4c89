"""Which replicas' engines an agent observes for fabricd (pure).

An agent's heartbeat names the replicas it scrapes and probes and whose observations fabricd
accepted (Node.observed_replicas, agent.engine_watch). A replica counts only where it is placed
on the node that names it, so a node can never stop fabricd from observing another node's
engines. The routing controller reads these replicas' observations from the store instead of
scraping them, and the reconcile pass reads their health from the same observations instead of
probing; every other replica (no agent, an agent that does not observe engines, a replica the
agent does not know, a replica created since its last heartbeat) is scraped and probed from
fabricd. A silent agent's heartbeat stops too, so its list stays as it was and those
observations age out (weight 0, health unknown), as a failed scrape does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from common.schemas import Node, Replica


def observed_by_node(nodes: Mapping[str, Node]) -> dict[str, set[str]]:
    """node id -> the replicas its agent reports (the index ``agent_observed`` reads)."""
    return {n.id: set(n.observed_replicas) for n in nodes.values() if n.observed_replicas}


def agent_observed(listed: Mapping[str, set[str]], replicas: Iterable[Replica]) -> set[str]:
    """The ids of ``replicas`` that the agent of the node each is placed on reports
    (``listed``: ``observed_by_node`` of the nodes)."""
    return {r.replica_id for r in replicas if r.replica_id in listed.get(r.node, ())}
