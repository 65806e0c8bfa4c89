"""A tenant's inference limits at the gateway, beside the gateway-wide settings. Stored under
/fabric/tenant-limits/{tenant}; fabricd writes them (admin only, controlplane.api.tenant_limits),
the gateway reads them (gateway.tenant_caps).

``max_context_tokens``: prompt (about one token per four characters) plus max_tokens must fit in
it as well as in FABRIC_MAX_CONTEXT; a call over it is 400 ``context_length_exceeded``, and a
body without max_tokens gets a default that fits it. Only the tighter of the two applies.
"""

from __future__ import annotations

import time

from pydantic import Field, field_validator

from common.schemas import Spec, tenant_name


class TenantLimits(Spec):
    tenant: str
    max_context_tokens: int | None = Field(None, ge=1, le=10_000_000,
                                           description="prompt + max_tokens per call; absent: the gateway's")
    updated_at: float = Field(default_factory=time.time)

    @field_validator("tenant")
    @classmethod
    def _tenant(cls, v: str) -> str:
        return tenant_name(v)
