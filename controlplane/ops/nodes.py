"""Node operations: what an agent reports (register, heartbeat), what only an admin changes (a
node's identity, its certificate, join tokens, deleting it) and a node's join with a token.

  - A report may not change a registered node's address or site (409 node_identity_fixed:
    controlplane.node_trust); a first registration takes the site, replica networks and balancer
    role its certificate or join token granted. A heartbeat of an unregistered node is 404 not_registered.
  - A node is a balancer (it carries the VIPs' Maglev services and announces them) when its grant
    says so, or, when the grant is silent, when no registered node is a balancer yet: a single host
    and a fleet's first node serve VIPs without a step (``first_role``). An admin changes the role
    (``set_role``); the routing controller moves the services on its next pass.
  - A node whose agent observes its engines reports their observations (``report_observations``):
    only for replicas placed on it (403 not_your_replica otherwise), its clock moved onto fabricd's,
    stored in one batch (common.records.observations.put_all).
  - A node holding replicas cannot be deleted (409 node_busy: drain it first); deleting one
    revokes its certificates, so a stolen one dies with it.
Every change but a heartbeat is an event (the join token and private keys never are).
"""

from __future__ import annotations

import time
from pathlib import Path

from pydantic import ValidationError

from common.agent_api import NodeCertificate, NodeReport, ObservationAnswer, ObservationReport
from common.errors import Conflict, Forbidden, InvalidInput, NotFound
from common.pki import ROLE_NODE, ensure_ca, issue_cert
from common.records import nodes as node_records
from common.records import observations
from common.records import replicas as replica_records
from common.schemas import Node
from controlplane import join_tokens, node_certs
from controlplane.node_trust import identity_change
from controlplane.ops import common
from controlplane.orchestration_state import load_snapshot
from controlplane.state import AppState
from controlplane.tenancy.principal import Principal


def merge_report(stored: Node | None, report: NodeReport, now: float) -> Node:
    """The node record after a registration or heartbeat: the report wins, except that
    - a temperature or power of 0 (unknown: no sensor, no nvidia-smi) keeps the stored reading;
    - a GPU whose readings are not live (bound to vfio-pci, or lost: nobody can read it) keeps
      its stored ECC count and row-remap flags. Live ECC counts and flags replace the stored
      ones, 0 included, so they can return to 0.
    GPUs are matched by PCI address."""
    previous = {g.pci: g for g in stored.gpus} if stored else {}
    gpus = []
    for gpu in report.gpus:
        old = previous.get(gpu.pci)
        if old is not None:
            update: dict[str, object] = {
                "temperature_c": gpu.temperature_c or old.temperature_c,
                "power_w": gpu.power_w or old.power_w,
            }
            if not gpu.readings_live:
                update.update(ecc_uncorrected=old.ecc_uncorrected, remapped_rows_pending=old.remapped_rows_pending,
                              remapped_rows_failed=old.remapped_rows_failed)
            gpu = gpu.model_copy(update=update)
        gpus.append(gpu)
    fixed = {} if stored is None else {  # set at registration, changed by an admin only (node_trust)
        "address": stored.address, "site": stored.site, "replica_networks": stored.replica_networks,
        "cordoned": stored.cordoned, "balancer": stored.balancer}
    return Node(**{**report.model_dump(exclude={"gpus"}), "gpus": gpus, "last_heartbeat": now, **fixed})


def first_role(granted: bool | None, fleet_has_balancer: bool) -> bool:
    """Pure: whether a node registering for the first time is a balancer. ``granted``: its token's
    or admin's word (None: none given)."""
    return (not fleet_has_balancer) if granted is None else granted


def _save(ctx: AppState, report: NodeReport, *, must_exist: bool) -> tuple[Node, bool]:
    """Read-modify-write of one node record (created when absent); returns (node, created)."""
    def build(stored: Node | None) -> Node:
        if stored is None and must_exist:
            raise NotFound(f"node {report.id} is not registered; POST /api/ai/nodes first",
                           code="not_registered")
        if stored is not None and (why := identity_change(stored, report.address, report.site)):
            raise Conflict(why, code="node_identity_fixed")
        node = merge_report(stored, report, time.time())
        if stored is None and granted is not None:  # site and networks from its token or admin
            if report.site != granted.site:
                raise Conflict(f"node {report.id} reports site {report.site or '(none)'}, but its certificate was "
                               f"granted site {granted.site or '(none)'}; an admin changes it with "
                               f"PUT /api/ai/nodes/{report.id}/identity after registration", code="node_identity_fixed")
            node = node.model_copy(update={"replica_networks": granted.replica_networks})
        if stored is None:
            node = node.model_copy(update={"balancer": first_role(
                granted.balancer if granted is not None else None,
                any(n.balancer for n in node_records.list(ctx.store)))})
        return node

    granted = node_certs.records.get(ctx.store, report.id)

    return node_records.upsert(ctx.store, report.id, build)


def register(ctx: AppState, report: NodeReport) -> tuple[Node, bool]:
    """A node's registration (the caller proved it is that node): (node, registered for the first time)."""
    node, created = _save(ctx, report, must_exist=False)
    if created:
        common.event(ctx, "node", node.id, "registered",
                     f"node {node.id} registered with {len(node.gpus)} GPUs ({node.vm_driver} driver)"
                     f"{', a balancer' if node.balancer else ''}")
    return node, created


def heartbeat(ctx: AppState, report: NodeReport) -> Node:
    return _save(ctx, report, must_exist=True)[0]


def report_observations(ctx: AppState, node_id: str, report: ObservationReport, now: float) -> ObservationAnswer:
    """Store the observations a node's agent reports for the engines on its host. Each replica must
    be placed on ``node_id`` (the reported replicas read together, one store round trip per
    report); one placed elsewhere refuses the whole report, a replica already gone is ignored.
    Times move onto fabricd's clock (now - sent_at), so a skewed agent clock neither ages nor
    freshens them."""
    shift = now - report.sent_at
    batch, ignored = [], []
    placed = replica_records.get_all(ctx.store, [(i.deployment, i.replica_id) for i in report.observations])
    for item, replica in zip(report.observations, placed):
        if replica is None:
            ignored.append(item.replica_id)
            continue
        if replica.node != node_id:
            raise Forbidden(f"replica {item.replica_id} is not placed on node {node_id}; a node reports only "
                            "the engines on its own host", code="not_your_replica")
        obs = item.record()
        batch.append(obs.model_copy(update={
            "scraped_at": obs.scraped_at + shift,
            "stalled_since": obs.stalled_since + shift if obs.stalled_since is not None else None}))
    if batch:
        observations.put_all(ctx.store, batch)
    return ObservationAnswer(accepted=len(batch), ignored=ignored)


def issue_certificate(ctx: AppState, caller: Principal | None, node_id: str, hosts: list[str], site: str,
                      replica_networks: list[str], balancer: bool | None = None) -> NodeCertificate:
    """A client+server certificate with CN=node_id from the cluster CA. The private key is returned
    once and removed from fabricd's PKI directory: only the node should keep it."""
    node_certs.grant(ctx.store, node_id, site=site, replica_networks=replica_networks, any_node=False,
                     now=time.time(), balancer=balancer)
    ca_crt, _ = ensure_ca(Path(ctx.state_dir))
    crt, key = issue_cert(Path(ctx.state_dir), node_id, server=True, client=True, role=ROLE_NODE, hosts=hosts)
    try:
        issued = NodeCertificate(node_id=node_id, cert_pem=crt.read_text(), key_pem=key.read_text(),
                                 ca_pem=ca_crt.read_text())
    finally:
        key.unlink(missing_ok=True)
    common.event(ctx, "node", node_id, "certificate-issued",
                 f"certificate for node {node_id} issued (SANs: {', '.join(hosts)})")
    return issued


def set_identity(ctx: AppState, caller: Principal | None, node_id: str, changes: dict) -> Node:
    """Change a node's agent address, site or replica networks (a node's own reports cannot)."""
    def change(stored: Node) -> Node:
        try:
            node = Node.model_validate({**stored.model_dump(), **changes})
            if "address" in changes:
                NodeReport(id=node_id, address=node.address)  # the same address rule as a report
        except ValidationError as exc:
            first = exc.errors()[0]
            raise InvalidInput(f"{'.'.join(str(x) for x in first['loc']) or 'identity'}: {first['msg']}") from None
        return node

    node = node_records.update(ctx.store, node_id, change)
    common.event(ctx, "node", node_id, "identity-set",
                 f"node {node_id}: {', '.join(f'{k} {v}' for k, v in sorted(changes.items()))} (by an admin)")
    return node


def set_role(ctx: AppState, caller: Principal | None, node_id: str, balancer: bool) -> Node:
    """Make a node a balancer or take the role away (an admin's). The routing controller pushes
    every service to a new balancer and removes them from a former one on its next pass."""
    before: list[bool] = []

    def change(stored: Node) -> Node:
        before[:] = [stored.balancer]
        return stored.model_copy(update={"balancer": balancer})

    node = node_records.update(ctx.store, node_id, change)
    if before != [balancer]:
        common.event(ctx, "node", node_id, "role-set",
                     f"node {node_id} is {'now a balancer' if balancer else 'no longer a balancer'} (by an admin); "
                     "the routing controller moves its VIP services on its next pass")
    return node


def create_join_token(ctx: AppState, caller: Principal | None, *, node_id: str | None, hosts: list[str], ttl_s: int,
                      site: str | None, replica_networks: list[str], balancer: bool | None = None):
    """(the token, shown once; its record)."""
    token, record = join_tokens.create(ctx.store, Path(ctx.state_dir), node_id=node_id, hosts=hosts, ttl_s=ttl_s,
                                       now=time.time(), site=site, replica_networks=replica_networks,
                                       balancer=balancer)
    common.event(ctx, "node", node_id or "-", "join-token-created",
                 f"join token {record.id} for {node_id or 'any node'}, valid {ttl_s}s")
    return token, record


def join(ctx: AppState, token: str, node_id: str, csr_pem: str) -> tuple[str, str, float]:
    """Spend a join token on ``node_id``'s CSR: (certificate, CA, not_after)."""
    now = time.time()
    taken = node_certs.join_refusal(node_certs.records.get(ctx.store, node_id),
                                    node_records.exists(ctx.store, node_id), any_node=True)
    if taken and join_tokens.for_any_node(ctx.store, token):
        raise Conflict(taken, code="node_id_taken")  # said before the token is spent
    record = join_tokens.consume(ctx.store, token, node_id, now)
    node_certs.grant(ctx.store, node_id, site=record.site or "", replica_networks=record.replica_networks,
                     any_node=record.node_id is None, now=now, balancer=record.balancer)
    cert, ca, not_after = join_tokens.sign_csr(Path(ctx.state_dir), csr_pem, node_id, record.hosts)
    common.event(ctx, "node", node_id, "joined",
                 f"node {node_id} joined with token {record.id}; certificate until {time.ctime(not_after)}")
    return cert, ca, not_after


def renewed(ctx: AppState, node_id: str, not_after: float) -> None:
    common.event(ctx, "node", node_id, "certificate-renewed",
                 f"node {node_id} renewed its certificate until {time.ctime(not_after)}")


def delete(ctx: AppState, caller: Principal | None, node_id: str) -> None:
    """Remove a node and revoke its certificates: one signed before now can no longer register,
    heartbeat or renew (controlplane.node_certs)."""
    held = load_snapshot(ctx.store).committed().get(node_id)
    if held is not None and held.replicas:
        raise Conflict(f"node {node_id} holds {held.replicas} replicas; drain it first "
                       f"(fabricctl ai node drain {node_id}) and delete it once they are gone", code="node_busy")
    known = node_records.exists(ctx.store, node_id) or node_certs.records.exists(ctx.store, node_id)
    if not known:
        raise NotFound(f"node {node_id!r} not found")
    node_certs.revoke(ctx.store, node_id, time.time())
    node_records.discard(ctx.store, node_id)
    common.event(ctx, "node", node_id, "deleted", f"node {node_id} deleted by an admin; its certificates are revoked")
