"""Node join and certificate renewal (controlplane.join_tokens has the records and the signing).

    POST /api/ai/join-tokens              admin: a one-time, short-lived join token
    GET  /api/ai/join-tokens              admin: the unexpired ones (never their secrets)
    GET  /api/ai/join/ca                  public: the cluster CA certificate (the joiner checks
                                          its SHA-256 against the one in its token)
    POST /api/ai/join                     public, the token in the body: sign the node's CSR
    POST /api/ai/nodes/{node_id}/renew    node (mTLS with its current, unrevoked node certificate): sign
                                          a new CSR, at most node_certs.RENEWALS_PER_HOUR an hour
    DELETE /api/ai/nodes/{node_id}        admin: remove the node and revoke every certificate it has
                                          (409 while replicas are on it: drain it first)

A token without a node id only creates a new node (409 node_id_taken otherwise), and the node's
site and replica networks come from the token (controlplane.node_certs).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator

from common.errors import InvalidInput
from common.peer_cert import TLS_EXT
from common.pki import MAX_SAN_HOSTS, check_san_host, node_id_refusal
from common.schemas import check_name
from controlplane import join_tokens, node_certs
from controlplane.auth import PrincipalDep, require_admin
from controlplane.node_certs import NodeGrant
from controlplane.node_identity import peer_node_cn, require_node
from controlplane.ops import nodes as node_ops
from controlplane.state import AppState, get_state

router = APIRouter(prefix="/api/ai", tags=["nodes"], dependencies=[Depends(require_admin)])
public = APIRouter(prefix="/api/ai", tags=["nodes"])
public_routers = (public,)
StateDep = Annotated[AppState, Depends(get_state)]


def _node_id(value: str) -> str:
    check_name(value, "node id")
    if why := node_id_refusal(value):
        raise ValueError(why)
    return value


class JoinTokenRequest(NodeGrant):
    model_config = ConfigDict(extra="forbid")
    node_id: str | None = Field(None, description="bind the token to this node id (default: any)")
    hosts: list[str] = Field(default_factory=list, max_length=MAX_SAN_HOSTS,
                             description="extra host names or IPs the node's certificate names")
    ttl_s: int = Field(join_tokens.DEFAULT_TTL_S, description=f"60-{join_tokens.MAX_TTL_S} seconds")

    @field_validator("node_id")
    @classmethod
    def _node(cls, v: str | None) -> str | None:
        return None if v is None else _node_id(v)

    @field_validator("hosts")
    @classmethod
    def _hosts(cls, v: list[str]) -> list[str]:
        return [check_san_host(h) for h in v]


class JoinToken(BaseModel):
    token: str = Field(..., description="shown once: fjt1.ID.SECRET.CA_SHA256")
    id: str
    node_id: str | None
    expires_at: float
    command: str


class JoinTokenView(BaseModel):
    id: str
    node_id: str | None
    hosts: list[str]
    expires_at: float


class JoinRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    token: str = Field(..., max_length=200)
    node_id: str
    csr_pem: str = Field(..., max_length=8192)

    @field_validator("node_id")
    @classmethod
    def _node(cls, v: str) -> str:
        return _node_id(v)


class RenewRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    csr_pem: str = Field(..., max_length=8192)


class SignedCertificate(BaseModel):
    node_id: str
    cert_pem: str
    ca_pem: str
    not_after: float


@router.post("/join-tokens", response_model=JoinToken, status_code=201)
def create_join_token(body: JoinTokenRequest, state: StateDep, who: PrincipalDep) -> JoinToken:
    token, record = node_ops.create_join_token(state, who, node_id=body.node_id, hosts=body.hosts, ttl_s=body.ttl_s,
                                               site=body.site, replica_networks=body.replica_networks,
                                               balancer=body.balancer)
    node = body.node_id or "NODE"
    return JoinToken(token=token, id=record.id, node_id=record.node_id, expires_at=record.expires_at,
                     command=f"FABRIC_JOIN_TOKEN_FILE=FILE fabric-agent join --node-id {node} --control-plane URL "
                             "(FILE holds the token, mode 0600; never put it on a command line)")


@router.get("/join-tokens", response_model=list[JoinTokenView])
def list_join_tokens(state: StateDep) -> list[JoinTokenView]:
    return [JoinTokenView(id=r.id, node_id=r.node_id, hosts=r.hosts, expires_at=r.expires_at)
            for r in join_tokens.list_active(state.store, time.time())]


@public.get("/join/ca", response_class=PlainTextResponse)
def cluster_ca(state: StateDep) -> str:
    from common.pki import ensure_ca

    return ensure_ca(Path(state.state_dir))[0].read_text()


@public.post("/join", response_model=SignedCertificate)
def join(body: JoinRequest, state: StateDep) -> SignedCertificate:
    cert, ca, not_after = node_ops.join(state, body.token, body.node_id, body.csr_pem)
    return SignedCertificate(node_id=body.node_id, cert_pem=cert, ca_pem=ca, not_after=not_after)


@public.post("/nodes/{node_id}/renew", response_model=SignedCertificate)
def renew(node_id: str, body: RenewRequest, request: Request, state: StateDep,
          caller: Annotated[str, Depends(require_node)]) -> SignedCertificate:
    chain = ((request.scope.get("extensions") or {}).get(TLS_EXT) or {}).get("client_cert_chain") or []
    if peer_node_cn(request) is None or not chain:
        raise InvalidInput("renewal needs the node's current certificate (mutual TLS)")
    node_certs.check_renewal(state.store, caller, time.time())
    hosts = join_tokens.cert_hosts(chain[0])  # a renewal keeps the SANs the admin allowed
    cert, ca, not_after = join_tokens.sign_csr(Path(state.state_dir), body.csr_pem, caller,
                                               [h for h in hosts if h != caller])
    node_ops.renewed(state, caller, not_after)
    return SignedCertificate(node_id=caller, cert_pem=cert, ca_pem=ca, not_after=not_after)


@router.delete("/nodes/{node_id}", status_code=204)
def delete_node(node_id: str, state: StateDep, who: PrincipalDep) -> None:
    """Remove a node and revoke its certificates: one signed before now can no longer register,
    heartbeat or renew (controlplane.node_certs). A stolen certificate dies with it."""
    node_ops.delete(state, who, node_id)
