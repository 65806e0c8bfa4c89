"""Node certificate records (/fabric/node-certs/<node id>): what an admin granted a node id when
its first certificate was signed (a join token or `fabricctl ai node add`), when its certificates
were signed lately (renewals are rate-limited), and since when its older certificates are
revoked (`fabricctl ai node delete`). controlplane.node_certs holds the decisions."""

from __future__ import annotations

from pydantic import BaseModel, Field

from common import keyspace
from common.records.resource import Records

KIND = "node certificate record"


class NodeCertRecord(BaseModel):
    node_id: str
    site: str = ""  # the site the node registers in, granted with its first certificate
    replica_networks: list[str] = Field(default_factory=list)  # granted the same way
    balancer: bool | None = None  # granted the same way (None: a balancer only if no node is one yet)
    signed: list[float] = Field(default_factory=list)  # recent signings (UNIX s), oldest first
    revoked_before: float = 0  # a certificate of this node signed before this is revoked


RECORDS = Records(NodeCertRecord, keyspace.node_certs, KIND, name_field="node_id")
(get, require, exists, stored, stored_items, list, create, put, update,  # noqa: A001 - the module's verbs
 upsert, update_at, update_status, delete, discard, versioned, count) = RECORDS.verbs()
