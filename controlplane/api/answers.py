"""Small answer shapes shared by several routes, declared as ``response_model`` so the OpenAPI
document says what each route answers (and the schema fuzzing checks the bodies against it)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from common.records.events import EventRecord
from common.schemas import ApiKeyRecord, Replica, Site, TenantQuota


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
    used_cpu: int = Field(..., description="CPU cores the tenant's deployments hold now")
    used_memory_gib: float = Field(..., description="GiB of memory the tenant's deployments hold now")
    room: dict[str, float | None] = Field(..., description="what the tenant may still add: gpus, cpu, memory_gib "
                                          "(null: not limited)")


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


class Span(BaseModel):
    start: int | float
    end: int | float | None = None
    seconds: int | float


class UsageRow(BaseModel):
    gpu_seconds_reserved: int | float
    gpu_seconds_ready: int | float
    tokens: int


class DeploymentUsage(UsageRow):
    deployment: str
    tenant: str | None


class TenantUsage(UsageRow):
    tenant: str | None


class FinopsReport(BaseModel):
    window: Span = Field(..., description="the GPU-seconds window: start, end, seconds")
    token_window: Span = Field(..., description="the usage ledger's hours the tokens come from: start, seconds")
    deployments: list[DeploymentUsage]
    tenants: list[TenantUsage]


class LogChunk(BaseModel):
    replica_id: str
    node: str
    text: str
    offset: int = Field(..., description="where this chunk starts")
    next_offset: int = Field(..., description="where the next read starts")
    size: int = Field(..., description="the log's size now")


class BlobStored(BaseModel):
    model: str
    digest: str
    path: str
    bytes: int | None = Field(None, description="a blob's size (absent for a manifest)")


class RolloutExplained(BaseModel):
    """The deployment's latest rollout and why it is where it is (without one: ``rollout`` null
    and a ``message``)."""
    deployment: str
    revision: int
    rollout: dict[str, Any] | None = Field(..., description="the rollout record")
    message: str | None = None
    phase: str | None = None
    sets: dict[str, dict[str, Any]] | None = Field(None, description="old and new: revision, target, replicas, "
                                                   "ready, healthy, members")
    step_held_secs: float | None = None
    window: dict[str, Any] | None = Field(None, description="finished, failed, error_rate, mean_ttft_ms, "
                                          "min_requests")
    endpoints: list[dict[str, Any]] | None = Field(None, description="endpoint, share_percent, table_share, "
                                                   "slot_error, weights (of its published plan), published, "
                                                   "generation")


class ScalingDecision(BaseModel):
    action: str
    replicas: int
    code: str
    reason: str
    summary: str


class ScalingExplained(BaseModel):
    deployment: str
    enabled: bool
    autoscaling: dict[str, Any] | None = Field(..., description="the deployment's autoscaling spec")
    decision: ScalingDecision
    signal: dict[str, Any] = Field(..., description="desired, ready, fresh, queue_depth, ttft_ms, stale, "
                                   "fresh_within_s")
    memory: dict[str, Any] = Field(..., description="last_scale_at, last_action")
    status: dict[str, Any] = Field(..., description="scaling, message")
    conditions: dict[str, dict[str, Any]] | None = Field(None, description="with a spec: each scale rule's "
                                                         "value, threshold, met, held and needed seconds")


class AdmitVerdict(BaseModel):
    """The answer to a bare deployment body."""
    allowed: bool
    reasons: list[str]
    name: str | None


class ReviewStatus(BaseModel):
    code: int
    reason: str
    message: str


class ReviewVerdict(BaseModel):
    uid: str
    allowed: bool
    status: ReviewStatus | None = Field(None, description="present when refused")


class AdmissionReviewAnswer(BaseModel):
    """The answer to a Kubernetes AdmissionReview body (admission.k8s.io/v1)."""
    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)
    api_version: str = Field(..., alias="apiVersion")
    kind: str
    response: ReviewVerdict


class DocumentMetadata(BaseModel):
    name: str | None = None
    tenant: str | None = Field(None, description="only on kinds that carry a tenant, when set")


class Document(BaseModel):
    """A stored record as a declarative document (controlplane.api.documents.to_document)."""
    model_config = ConfigDict(populate_by_name=True)
    apiVersion: str  # noqa: N815 - the document's own field name
    kind: str
    metadata: DocumentMetadata
    spec: dict[str, Any] = Field(description="the record without its name, tenant and server-owned fields")
    status: dict[str, Any] | None = Field(None, description="as stored, on kinds with a status")


class ApplyResult(BaseModel):
    kind: str
    name: str
    action: Literal["created", "updated", "unchanged"]
    diff: list[dict[str, Any]] = Field(description="per changed field: field, from, to")


class Applied(BaseModel):
    dry_run: bool
    results: list[ApplyResult]
