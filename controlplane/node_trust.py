"""What fabricd takes from a node, and what it does not (issue 40: a compromised node).

A node proves its id with its certificate (controlplane.node_identity), and fabricd's client
pins the agent's certificate to that id (controlplane.agent_client). Beyond that, a node's own
report is believed only where a lie harms nobody else:

  - its agent address and site are fixed at registration: a later report naming another address
    (another node's agent, whose VMs would then look orphaned and be deleted) or another site (to
    attract residency-bound replicas) is refused 409 "node_identity_fixed"; an admin changes them
    with PUT /api/ai/nodes/{id}/identity;
  - the address a VM reports for its replica must lie in the node's replica networks (admin-set
    CIDRs, same route); with none set, it must be a private address, and a loopback one only when
    the agent itself is on loopback (the all-in-one lab). Otherwise the replica is refused, so the
    gateway never forwards callers' requests to an address a node chose (etcd, fabricd, a host
    outside the cluster).

``identity_change`` and ``replica_host_refusal`` are the pure decisions.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from common.listen import is_loopback
from common.schemas import Node


def identity_change(stored: Node, address: str, site: str) -> str | None:
    """Why a registered node's report may not be taken (None: it names its fixed address and site)."""
    changed = []
    if address.rstrip("/") != stored.address.rstrip("/"):
        changed.append(f"address {stored.address} (it reports {address})")
    if site != stored.site:
        changed.append(f"site {stored.site or '(none)'} (it reports {site or '(none)'})")
    if not changed:
        return None
    return (f"node {stored.id} registered with {' and '.join(changed)}; a node cannot change these itself. "
            f"An admin changes them with PUT /api/ai/nodes/{stored.id}/identity")


def _agent_on_loopback(node: Node) -> bool:
    return is_loopback(urlsplit(node.address).hostname or "")


def replica_host_refusal(node: Node, host: str | None, port: int) -> str | None:
    """Why the address a node's agent reported for a VM may not become a replica's (None: fine)."""
    if not host:
        return None  # no address yet: nothing is routed to it
    if not 1 <= port <= 65535:
        return f"the agent on {node.id} reported port {port} for a VM"
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return f"the agent on {node.id} reported {host!r} for a VM: not an IP address"
    if node.replica_networks:
        if any(ip in ipaddress.ip_network(n) for n in node.replica_networks):
            return None
        return (f"the agent on {node.id} reported {host} for a VM, outside the node's replica networks "
                f"({', '.join(node.replica_networks)})")
    if ip.is_loopback:
        return None if _agent_on_loopback(node) else (
            f"the agent on {node.id} reported loopback {host} for a VM; only an agent on loopback may")
    if ip.is_unspecified or ip.is_multicast or ip.is_link_local or not ip.is_private:
        return (f"the agent on {node.id} reported {host} for a VM: not a private address (an admin sets the "
                f"node's replica_networks to allow others)")
    return None
