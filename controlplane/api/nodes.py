"""Nodes and GPUs in the control plane.

    GET  /api/ai/nodes                      admin: every node with online/offline and why
    GET  /api/ai/nodes/{id}                 admin
    POST /api/ai/nodes                      node: register (body.id must be the caller's node)
    POST /api/ai/nodes/{id}/heartbeat       node: refresh; 404 "not_registered" tells the agent to register
    POST /api/ai/nodes/{id}/observations    node: its engines' observations that changed materially (only
                                            replicas placed on it: 403 not_your_replica; ops.nodes)
    POST /api/ai/nodes/{id}/certificate     admin: issue the node's certificate from the cluster CA
    PUT  /api/ai/nodes/{id}/identity        admin: the node's address, site, replica networks (a node's
                                            own report cannot change them: controlplane.node_trust)
    PUT  /api/ai/nodes/{id}/role            admin: {"balancer": true|false}, whether the node carries the
                                            VIPs' Maglev services and announces them (docs/dataplane.md)
    GET  /api/ai/gpus                       admin: every GPU with the replica holding it, if any

"node" means the caller proved it is that node (controlplane/node_identity.py: a client
certificate from the cluster CA whose CN is the node id). A node is offline when its last
heartbeat is older than 60 s (controlplane.placement.scheduler.node_online); GET shows why.
Heartbeat temperature/power of 0 mean unknown and keep the stored value; ECC counts and row-remap
flags of a GPU nobody can read (readings_live false: bound to vfio-pci, or lost) keep the stored
values, while live ones replace them, 0 included, so a count can return to 0.
"""

from __future__ import annotations

import json
import time
from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response
from pydantic import BaseModel, ConfigDict, Field, field_validator

from common.agent_api import NodeCertificate, NodeReport, ObservationAnswer, ObservationReport
from common.errors import Conflict, InvalidInput
from common.pki import MAX_SAN_HOSTS, check_san_host, node_id_refusal
from common.records import gpu_reservations
from common.records import nodes as node_records
from common.records import sites as site_records
from common.schemas import GpuInfo, Node, check_name
from controlplane.auth import PrincipalDep, require_admin
from controlplane.node_certs import NodeGrant
from controlplane.node_identity import authenticate_node, require_node
from controlplane.ops import nodes as node_ops
from controlplane.orchestration_state import load_snapshot
from controlplane.placement.scheduler import NOTHING_COMMITTED, Committed, SchedulerSettings, node_online
from controlplane.state import AppState, get_state

router = APIRouter(prefix="/api/ai", tags=["nodes"])
admin = [Depends(require_admin)]
StateDep = Annotated[AppState, Depends(get_state)]

OFFLINE_AFTER_S = SchedulerSettings().offline_after_s


class NodeView(Node):
    """A node as the API shows it: ``cpu_free``/``memory_free_gib`` are what is left after the
    replicas there (node_resources), the agent's own figures are the ``*_allocatable`` ones."""
    online: bool
    phase: str
    message: str
    cpu_allocatable: int = 0
    cpu_committed: int = 0
    memory_allocatable_gib: float = 0
    memory_committed_gib: float = 0
    fail_closed_unix: float | None = Field(None, description="the node's site's fail_closed_unix, in the answer "
                                           "to a registration or heartbeat (agent.fail_closed)")


class GpuView(GpuInfo):
    node: str
    node_online: bool
    allocated_to: str | None = None


class CertificateRequest(NodeGrant):
    model_config = ConfigDict(extra="forbid")
    hosts: list[str] = Field(default_factory=list, max_length=MAX_SAN_HOSTS,
                             description=f"extra SANs the agent serves under: IP addresses or DNS names "
                                         f"(no wildcard), at most {MAX_SAN_HOSTS}")

    @field_validator("hosts")
    @classmethod
    def _hosts(cls, hosts: list[str]) -> list[str]:
        return [check_san_host(h) for h in hosts]


# -- views ----------------------------------------------------------------------------------------

def node_resources(node: Node, held: Committed) -> dict:
    """A node's CPU and memory as every view shows them (node list/show, capacity, the console's
    strip): what its agent offers (the heartbeat's figures), what its replicas hold, what is free.
    The one computation of these figures, so the views cannot disagree."""
    return {"cpu_allocatable": node.cpu_free, "cpu_committed": held.cpu, "cpu_free": node.cpu_free - held.cpu,
            "memory_allocatable_gib": node.memory_free_gib, "memory_committed_gib": round(held.memory_gib, 6),
            "memory_free_gib": round(node.memory_free_gib - held.memory_gib, 6)}


def node_view(node: Node, now: float, offline_after_s: float = OFFLINE_AFTER_S,
              held: Committed = NOTHING_COMMITTED) -> NodeView:
    # A record never heartbeated (last_heartbeat 0) is offline whatever the clock says.
    online = node.last_heartbeat > 0 and node_online(node, now, SchedulerSettings(offline_after_s=offline_after_s))
    if online:
        message = f"heartbeat {max(0.0, now - node.last_heartbeat):.0f}s ago"
    elif node.last_heartbeat <= 0:
        message = "never sent a heartbeat"
    else:
        message = (f"offline: last heartbeat {now - node.last_heartbeat:.0f}s ago "
                   f"(more than {offline_after_s:.0f}s)")
    if node.inventory_message:
        message += f"; inventory: {node.inventory_message}"
    if node.cordoned:
        message += f"; cordoned: {node.cordoned}"
    phase = ("Cordoned" if node.cordoned else "Ready") if online else "Offline"
    return NodeView(**{**node.model_dump(), **node_resources(node, held)}, online=online, phase=phase,
                    message=message)


def reservation_owner(value: str) -> str:
    """Who holds a GPU reservation, from the reservation's stored value (JSON or plain id)."""
    try:
        data = json.loads(value)
    except ValueError:
        return value
    if isinstance(data, dict):
        for key in ("replica_id", "replica", "owner", "deployment"):
            if data.get(key):
                return str(data[key])
    return str(data)


def gpu_views(nodes: list[Node], reservations: dict[tuple[str, str], str], now: float) -> list[GpuView]:
    out = []
    for node in sorted(nodes, key=lambda n: n.id):
        online = node_online(node, now, SchedulerSettings(offline_after_s=OFFLINE_AFTER_S))
        for gpu in sorted(node.gpus, key=lambda g: g.pci):
            out.append(GpuView(**gpu.model_dump(), node=node.id, node_online=online,
                               allocated_to=reservations.get((node.id, gpu.pci))))
    return out


# -- routes ---------------------------------------------------------------------------------------

@router.get("/nodes", response_model=list[NodeView], dependencies=admin)
def list_nodes(state: StateDep) -> list[NodeView]:
    now = time.time()
    committed = load_snapshot(state.store).committed()
    return [node_view(n, now, held=committed.get(n.id, NOTHING_COMMITTED))
            for n in node_records.list(state.store)]


@router.get("/nodes/{node_id}", response_model=NodeView, dependencies=admin)
def get_node(node_id: str, state: StateDep) -> NodeView:
    node = node_records.require(state.store, node_id)
    return node_view(node, time.time(), held=load_snapshot(state.store).committed().get(node_id, NOTHING_COMMITTED))


@router.post("/nodes", response_model=NodeView,
             responses={201: {"model": NodeView, "description": "the node registered for the first time"}})
def register_node(report: NodeReport, request: Request, response: Response,
                  state: StateDep) -> NodeView:
    authenticate_node(request, state, report.id)
    node, created = node_ops.register(state, report)
    response.status_code = 201 if created else 200
    return _answer_to_agent(state, node)


def _answer_to_agent(state, node: Node) -> NodeView:
    """The node's view plus what its agent acts on: its site's fail_closed_unix."""
    site = site_records.get(state.store, node.site) if node.site else None
    return node_view(node, node.last_heartbeat).model_copy(
        update={"fail_closed_unix": site.fail_closed_unix if site is not None else None})


@router.post("/nodes/{node_id}/heartbeat", response_model=NodeView)
def heartbeat(node_id: str, report: NodeReport, state: StateDep,
              caller: Annotated[str, Depends(require_node)]) -> NodeView:
    if report.id != caller:
        raise InvalidInput(f"body id {report.id!r} does not match the path's node {node_id!r}")
    return _answer_to_agent(state, node_ops.heartbeat(state, report))


@router.post("/nodes/{node_id}/observations", response_model=ObservationAnswer)
def report_observations(node_id: str, report: ObservationReport, state: StateDep,
                        caller: Annotated[str, Depends(require_node)]) -> ObservationAnswer:
    """The agent's report of its engines (agent.engine_watch); a sync route, so the batch write
    runs in the server's thread pool, off the event loop."""
    return node_ops.report_observations(state, caller, report, time.time())


@router.post("/nodes/{node_id}/certificate", response_model=NodeCertificate, dependencies=admin)
def issue_node_certificate(node_id: str, state: StateDep, who: PrincipalDep,
                           body: CertificateRequest | None = None) -> NodeCertificate:
    """Sign a client+server certificate with CN=node_id. The private key is returned once and
    removed from fabricd's PKI directory: only the node should keep it."""
    try:
        check_name(node_id, "node id")
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None
    if why := node_id_refusal(node_id):
        raise Conflict(why, code="reserved_name")
    hosts = list(dict.fromkeys([node_id, "localhost", "127.0.0.1", *(body.hosts if body else [])]))
    return node_ops.issue_certificate(state, who, node_id, hosts, (body.site if body else None) or "",
                                      body.replica_networks if body else [], body.balancer if body else None)


class NodeIdentity(BaseModel):
    """What only an admin changes on a registered node (controlplane.node_trust)."""
    model_config = ConfigDict(extra="forbid")
    address: str | None = Field(None, description="agent base URL, https://HOST:PORT")
    site: str | None = Field(None, description="'' is no site")
    replica_networks: list[str] | None = Field(None, max_length=16, description="CIDRs its replicas' addresses "
                                                                                 "must lie in")


@router.put("/nodes/{node_id}/identity", response_model=NodeView, dependencies=admin)
def set_node_identity(node_id: str, body: NodeIdentity, state: StateDep, who: PrincipalDep) -> NodeView:
    """Change a node's agent address, site or replica networks (a node's own reports cannot)."""
    changes = {k: v for k, v in body.model_dump().items() if v is not None}
    return node_view(node_ops.set_identity(state, who, node_id, changes), time.time())


class NodeRole(BaseModel):
    """A node's role (controlplane.ops.nodes.set_role)."""
    model_config = ConfigDict(extra="forbid")
    balancer: bool = Field(..., description="carry every VIP's Maglev service and announce the VIPs over BGP")


@router.put("/nodes/{node_id}/role", response_model=NodeView, dependencies=admin)
def set_node_role(node_id: str, body: NodeRole, state: StateDep, who: PrincipalDep) -> NodeView:
    """Make a node a balancer or take the role away; the routing controller's next pass pushes every
    service to a new balancer and removes them from a former one."""
    node = node_ops.set_role(state, who, node_id, body.balancer)
    return node_view(node, time.time(), held=load_snapshot(state.store).committed().get(node_id, NOTHING_COMMITTED))


@router.get("/gpus", response_model=list[GpuView], dependencies=admin)
def list_gpus(state: StateDep) -> list[GpuView]:
    nodes = node_records.list(state.store)
    reservations = {where: reservation_owner(value) for where, value in gpu_reservations.every(state.store).items()}
    return gpu_views(nodes, reservations, time.time())
