"""Join-token records (/fabric/join-tokens/<id>): created under a store lease, so an unused token
is forgotten by the store itself, and deleted at the revision read when a joiner trades it
(controlplane.join_tokens checks the secret). Only the secret's SHA-256 is stored."""

from __future__ import annotations

from pydantic import BaseModel

from common import keyspace
from common.records import cas
from common.records.resource import Records
from common.store.base import Store

PREFIX = f"{keyspace.ROOT}/join-tokens/"
KIND = "join token"


class JoinTokenRecord(BaseModel):
    id: str
    secret_sha256: str
    node_id: str | None = None  # None: any node id the joiner names
    hosts: list[str] = []
    site: str | None = None  # granted to the node (None: no site)
    replica_networks: list[str] = []  # granted to the node
    balancer: bool | None = None  # granted to the node (None: a balancer only if no node is one yet)
    created_at: float
    expires_at: float


def key(token_id: str = "") -> str:
    return PREFIX + token_id


RECORDS = Records(JoinTokenRecord, key, KIND, name_field="id")
versioned, discard, list = RECORDS.versioned, RECORDS.discard, RECORDS.list  # noqa: A001 - the module's verbs


def create_leased(store: Store, record: JoinTokenRecord, lease_ttl_s: int) -> bool:
    """Create-if-absent under a fresh lease of ``lease_ttl_s``; False on an id collision."""
    record = cas.validated(JoinTokenRecord, record)
    lease = store.grant_lease(lease_ttl_s).id
    return store.create(key(record.id), record.model_dump_json(), lease=lease)
