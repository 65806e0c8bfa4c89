"""Which node certificates fabricd signs and still believes (issue 50: join tokens, roles,
revocation, renewal floods).

- A token made without a node id (an any-node token) may only create a NEW node id: one with no
  node record and no live certificate (signed since its last revocation). The check and the
  signing's record are one compare-and-swap, so two joiners racing for one id get one certificate.
  A token bound to an id, or an admin's `fabricctl ai node add`, may re-key an existing node.
- The site, replica networks and balancer role a node registers with come from its token or the
  admin who issued its certificate (the grant on its record), never from the node's own first report.
- `fabricctl ai node delete` revokes: every certificate of the node signed before the delete is
  refused on every node route (register, heartbeat, renew, ...). Revocation is by node id and
  signing time, so a certificate signed for a re-added node afterwards is good; certificates
  signed within the second of a delete count as revoked (the record keeps whole seconds).
- A node renews at most RENEWALS_PER_HOUR times an hour: each renewal writes an event, and a
  node renewing in a loop would otherwise flush the event log.

Pure decisions (`join_refusal`, `revoked`, `renewal_refusal`) and the writes that apply them.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, Field, field_validator

from common.errors import Conflict, Forbidden, LimitExceeded
from common.records import node_certs as records
from common.records import nodes as node_records
from common.records.node_certs import NodeCertRecord
from common.schemas import Node
from common.store.base import Store

RENEWALS_PER_HOUR = 4
WINDOW_S = 3600.0


class NodeGrant(BaseModel):
    """What an admin grants a node with its first certificate (a join token, `node add`)."""
    site: str | None = Field(None, description="the site the node registers in (default: none)")
    replica_networks: list[str] = Field(default_factory=list, max_length=16,
                                        description="CIDRs its replicas' addresses must lie in")
    balancer: bool | None = Field(None, description="the node carries the VIPs' services and announces them "
                                  "(a balancer); default: only when no node is a balancer yet (a single "
                                  "host, a fleet's first node)")

    @field_validator("replica_networks")
    @classmethod
    def _networks(cls, v: list[str]) -> list[str]:
        return Node(id="n", address="https://n:1", replica_networks=v).replica_networks


def live(record: NodeCertRecord | None) -> bool:
    """A certificate signed since the last revocation exists for this id."""
    return record is not None and any(t >= record.revoked_before for t in record.signed)


def join_refusal(record: NodeCertRecord | None, node_exists: bool, any_node: bool) -> str | None:
    if any_node and (node_exists or live(record)):
        return ("this node id is taken; a join token without --node-id only creates a new node "
                "(ask an admin for a token bound to this id to re-key it)")
    return None


def revoked(record: NodeCertRecord | None, signed_at: float) -> bool:
    return record is not None and signed_at < record.revoked_before


def renewal_refusal(record: NodeCertRecord | None, now: float) -> str | None:
    recent = [t for t in (record.signed if record else []) if now - t < WINDOW_S]
    if len(recent) >= RENEWALS_PER_HOUR:
        return (f"this node renewed its certificate {len(recent)} times in the last hour (at most "
                f"{RENEWALS_PER_HOUR}); try again later")
    return None


def _signed(record: NodeCertRecord, now: float) -> NodeCertRecord:
    keep = [t for t in record.signed if now - t < WINDOW_S and t >= record.revoked_before]
    return record.model_copy(update={"signed": [*keep, now]})


def grant(store: Store, node_id: str, *, site: str | None, replica_networks: list[str] | None,
          any_node: bool, now: float, balancer: bool | None = None) -> NodeCertRecord:
    """Record a first certificate (join, or an admin's issue) for node_id and what it is granted;
    Conflict when an any-node token names a taken id. None keeps the stored grant."""
    exists = node_records.exists(store, node_id)

    def build(current: NodeCertRecord | None) -> NodeCertRecord:
        if why := join_refusal(current, exists, any_node):
            raise Conflict(why, code="node_id_taken")
        base = current or NodeCertRecord(node_id=node_id)
        update: dict[str, object] = {}
        if site is not None:
            update["site"] = site
        if replica_networks is not None:
            update["replica_networks"] = replica_networks
        if balancer is not None:
            update["balancer"] = balancer
        return _signed(base.model_copy(update=update), now)

    return records.upsert(store, node_id, build)[0]


def check_renewal(store: Store, node_id: str, now: float) -> None:
    """Count a renewal; LimitExceeded (429 renewal_rate) past RENEWALS_PER_HOUR."""
    def build(current: NodeCertRecord | None) -> NodeCertRecord:
        if why := renewal_refusal(current, now):
            raise LimitExceeded(why, code="renewal_rate")
        return _signed(current or NodeCertRecord(node_id=node_id), now)

    records.upsert(store, node_id, build)


def check_not_revoked(store: Store, node_id: str, signed_at: float) -> None:
    if revoked(records.get(store, node_id), signed_at):
        raise Forbidden(f"this certificate of node {node_id} was revoked (the node was deleted); "
                        "an admin re-adds the node with a new join token", code="certificate_revoked")


def revoke(store: Store, node_id: str, now: float) -> None:
    """Revoke every certificate of node_id signed until now (whole seconds, rounded up); the
    grant goes with it, so a re-added node gets a new one."""
    def build(current: NodeCertRecord | None) -> NodeCertRecord:
        return NodeCertRecord(node_id=node_id, revoked_before=float(math.floor(now) + 1))

    records.upsert(store, node_id, build)
