"""Identity mappings: which endpoints an inference OIDC caller may call, from the groups or roles
claims identity providers emit. Stored under /fabric/identity-mappings/{name}; fabricd writes
them (admin only, controlplane.api.identity), the gateway reads them (gateway.oidc_access).

A mapping matches a verified token when the token's ``claim`` holds ``value``:
- ``claim`` is a claim name or a dotted path into nested objects: ``groups`` and
  ``realm_access.roles`` (Keycloak; groups are paths such as ``/ml-team``), ``roles`` and
  ``groups`` (Entra ID; groups are object GUIDs), ``resource_access.fabric.roles`` (a Keycloak
  client's roles);
- the claim's value is a list of strings (one of them must equal ``value``) or a string
  (space-separated words, as OAuth's ``scope``; one of them must equal ``value``);
- ``issuer`` set: only tokens from that issuer (several providers may share group names).

A matched mapping grants its ``endpoints`` (``*``: every endpoint) and, with ``tenant``, names
the tenant a caller whose token has no ``tenant`` claim acts as. ``matching`` and
``claim_values`` are pure.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable

from pydantic import Field, field_validator, model_validator

from common.schemas import Spec, check_name, tenant_name

CLAIM_PATH = re.compile(r"^[A-Za-z0-9_:$@-]{1,64}(\.[A-Za-z0-9_:$@-]{1,64}){0,4}$")
MAX_ENDPOINTS = 1000
MAX_VALUE = 256


class IdentityMapping(Spec):
    name: str = Field(..., description="a DNS label naming the mapping")
    claim: str = Field(..., description="claim name or dotted path: groups, roles, realm_access.roles")
    value: str = Field(..., description="the group or role the claim must hold: /ml-team, a GUID, ml-user")
    endpoints: list[str] = Field(default_factory=list, max_length=MAX_ENDPOINTS,
                                 description="endpoints granted (* for all); may be empty when tenant is set")
    issuer: str | None = Field(None, max_length=512, description="only tokens from this issuer; absent: any")
    tenant: str | None = Field(None, description="the tenant a matched caller acts as (token without a "
                                                  "tenant claim); its endpoints are granted too")
    created_at: float = Field(default_factory=time.time)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return check_name(v, "name")

    @field_validator("claim")
    @classmethod
    def _claim(cls, v: str) -> str:
        if not CLAIM_PATH.match(v):
            raise ValueError(f"claim {v!r}: a claim name or a dotted path of up to 5 names "
                             "(letters, digits, '_:$@-'), e.g. groups or realm_access.roles")
        return v

    @field_validator("value")
    @classmethod
    def _value(cls, v: str) -> str:
        if not v or len(v) > MAX_VALUE or any(c.isspace() for c in v):
            raise ValueError(f"value: 1-{MAX_VALUE} characters without whitespace (a group path, GUID or role)")
        return v

    @field_validator("endpoints")
    @classmethod
    def _endpoints(cls, v: list[str]) -> list[str]:
        for name in v:
            if name != "*":
                check_name(name, "endpoint")
        return sorted(set(v))

    @field_validator("tenant")
    @classmethod
    def _tenant(cls, v: str | None) -> str | None:
        return None if v is None else tenant_name(v)

    @model_validator(mode="after")
    def _grants_something(self) -> IdentityMapping:
        if not self.endpoints and self.tenant is None:
            raise ValueError("endpoints: name at least one endpoint (or *), or set tenant")
        return self


def claim_values(claims: dict, path: str) -> frozenset[str]:
    """Pure: the strings a claim (or dotted path) holds; empty when absent or of another shape."""
    value: object = claims
    for part in path.split("."):
        if not isinstance(value, dict):
            return frozenset()
        value = value.get(part)
    if isinstance(value, str):
        return frozenset(value.split())
    if isinstance(value, list):
        return frozenset(v for v in value if isinstance(v, str))
    return frozenset()


def matching(mappings: Iterable[IdentityMapping], claims: dict, issuer: str) -> list[IdentityMapping]:
    """Pure: the mappings a verified token's claims match, by name."""
    return sorted((m for m in mappings if (m.issuer is None or m.issuer == issuer)
                   and m.value in claim_values(claims, m.claim)), key=lambda m: m.name)
