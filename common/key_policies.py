"""The key policy record (/fabric/key-policies/<endpoint>): what an endpoint's API keys must meet
(controlplane.tenancy.key_policies judges a key against it)."""

from __future__ import annotations

import time
from typing import Literal

from pydantic import Field

from common.schemas import Spec

MAX_TTL_SECS = 10 * 365 * 86400
Scope = Literal["model", "tenant"]


class KeyPolicyBody(Spec):
    max_ttl_secs: int | None = Field(None, ge=1, le=MAX_TTL_SECS, description="keys must expire within this")
    required_scopes: list[Scope] = Field(default_factory=list, description="model and/or tenant")
    max_request_quota: int | None = Field(None, ge=1, le=10**15, description="keys need a quota at most this")
    viewer_playground: bool = Field(False, description="viewers may try the endpoint in the console's playground "
                                                       "(controlplane.api.playground_keys)")


class KeyPolicy(KeyPolicyBody):
    endpoint: str
    updated_at: float = Field(default_factory=time.time)
