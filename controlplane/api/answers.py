"""Small answer shapes shared by several routes, declared as ``response_model`` so the OpenAPI
document says what each route answers (and the schema fuzzing checks the bodies against it)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from common.schemas import ApiKeyRecord, Replica, Site, TenantQuota
from controlplane.events import EventRecord


class Deleted(BaseModel):
    """A record deleted (``deleted`` false: marked Deleting, its controller removes it)."""
    kind: str
    name: str
    deleted: bool = True


class NameDeleted(BaseModel):
    name: str
    deleted: bool = True


class TenantDeleted(BaseModel):
    kind: str
    tenant: str
    deleted: bool = True


class KeyDeleted(BaseModel):
    id: str
    name: str
    deleted: bool = True


class Drained(BaseModel):
    deployment: str
    drained: list[str]
    delete_after: float


class Restarted(BaseModel):
    deployment: str
    previous_phase: str | None
    previous_failures: int
    last_failure: str


class AuditCheck(BaseModel):
    ok: bool
    rows: int
    bad_seq: int | None
    reason: str


class UserView(BaseModel):
    """A user as the API shows it (never its password hash)."""
    name: str
    role: str
    tenant: str | None = None
    created_at: float


class QuotaUse(TenantQuota):
    used_gpus: int = Field(..., description="GPUs the tenant's deployments hold now")


class SiteView(Site):
    nodes: list[str] = Field(default_factory=list, description="the nodes that report this site")


class ReplicaView(Replica):
    drain_left_s: float | None = Field(None, description="seconds of grace left while draining")


class KeyView(ApiKeyRecord):
    """An API key as the API shows it: every field of the record but its digests (common.apikeys.public_view)."""
    hash: str = Field("", exclude=True)
    previous_hash: str | None = Field(None, exclude=True)
    rotating: bool
    requests_used: int
    expired: bool


class NewKey(KeyView):
    key: str = Field(..., description="the secret, shown this once")


class KindInfo(BaseModel):
    kind: str
    plural: str
    aliases: list[str]
    deletable: bool


class WatchChange(BaseModel):
    type: Literal["put", "delete"]
    name: str = Field(..., description="the record's name under the family's prefix")
    revision: int
    value: Any = Field(None, description="the record as stored (null for a delete or a value that is not JSON)")


class WatchAnswer(BaseModel):
    revision: int = Field(..., description="pass it back as ?revision= to wait for the next changes")
    changes: list[WatchChange]


class FailureExplained(BaseModel):
    replica: str
    current: Replica | None = Field(None, description="the replica record, when it still exists")
    failures: int
    summary: str
    history: list[EventRecord]
