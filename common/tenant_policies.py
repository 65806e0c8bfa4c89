"""The tenant policy record (/fabric/policies/<tenant>): which models, sources, capacity classes
and deploy hours a tenant may use (controlplane.tenancy.policies judges a deploy against it)."""

from __future__ import annotations

import time

from pydantic import Field, field_validator, model_validator

from common.schemas import CapacityClass, Spec, tenant_name

MAX_NAMES = 1000


class TenantPolicy(Spec):
    tenant: str
    allowed_models: list[str] | None = Field(None, max_length=MAX_NAMES, description="model names; absent: any")
    allowed_source_prefixes: list[str] | None = Field(
        None, max_length=MAX_NAMES, description="e.g. hf://my-org/ or file:///models/; absent: any")
    allow_pr_revisions: bool = Field(False, description="tenant-bound callers may register hf:// sources at "
                                     "@refs/pr/N (unreviewed pull-request revisions); off unless an admin allows")
    allowed_capacity_classes: list[CapacityClass] | None = Field(
        None, max_length=3, description="critical, standard, opportunistic; absent: standard and opportunistic "
        "(critical only when named here, or by an admin)")
    preempt_other_tenants: bool = Field(False, description="its deployments may preempt other tenants' "
                                        "lower-class replicas; off: only its own")
    deploy_hour_start: int | None = Field(None, ge=0, le=23, description="UTC hour deploys may start (included)")
    deploy_hour_end: int | None = Field(None, ge=0, le=23, description="UTC hour deploys stop (excluded)")
    updated_at: float = Field(default_factory=time.time)

    @field_validator("tenant")
    @classmethod
    def _tenant(cls, v: str) -> str:
        return tenant_name(v)

    @model_validator(mode="after")
    def _window(self) -> TenantPolicy:
        start, end = self.deploy_hour_start, self.deploy_hour_end
        if (start is None) != (end is None):
            raise ValueError("deploy_hour_start and deploy_hour_end: give both, or neither (always)")
        if start is not None and start == end:
            raise ValueError(f"deploy_hour_start equals deploy_hour_end ({start}): an empty window; "
                             "leave both out to allow deploys at any hour")
        return self
