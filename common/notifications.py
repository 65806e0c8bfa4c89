"""Notifications: budget thresholds and operator alerts, delivered to webhooks by fabricd.

A notification (/fabric/notifications/{id}) is created if absent, so its id is the
de-duplication: two gateways that see one budget cross 80% raise one notification, and an alert
condition that stays true raises one per incident (its id names the incident). fabricd's notify
pass (controlplane.tenancy.notifier, under the leader lease) delivers each to every webhook whose
filter takes it, retrying with backoff, and records per webhook: pending, delivered or failed.

A webhook (/fabric/webhooks/{name}) is a URL, a secret (never returned by the API) that signs each
body (``X-Fabric-Signature: sha256=<hex HMAC-SHA256(secret, "<timestamp>." + body)>`` with
``X-Fabric-Timestamp`` and ``X-Fabric-Event-Id``: a receiver checks the signature and drops an id
it has seen), the body format (``json``: the notification; ``slack``: ``{"text": ...}``, what a
Slack incoming webhook or a compatible receiver reads), and optional filters.
"""

from __future__ import annotations

import re
import time
from typing import Literal

from pydantic import BaseModel, Field, field_validator

from common.schemas import Spec, check_name, tenant_name

Kind = Literal["budget", "alert", "test"]
KINDS: list[Kind] = ["budget", "alert", "test"]
Severity = Literal["info", "warning", "page"]
EVENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$")


class Delivery(BaseModel):
    state: Literal["pending", "delivered", "failed"] = "pending"
    attempts: int = 0
    next_at: float = 0.0
    last_error: str = ""
    delivered_at: float | None = None


class Notification(BaseModel):
    id: str
    kind: Kind
    severity: Severity = "warning"
    title: str
    message: str
    tenant: str | None = None
    data: dict = Field(default_factory=dict)
    created_at: float = Field(default_factory=time.time)
    deliveries: dict[str, Delivery] = Field(default_factory=dict)  # webhook name -> its delivery

    @field_validator("id")
    @classmethod
    def _id(cls, v: str) -> str:
        if not EVENT_ID.match(v):
            raise ValueError("a notification id is 1-201 letters, digits, '.', '_' or '-'")
        return v

    def payload(self) -> dict:
        """What a ``json`` webhook receives (no delivery bookkeeping)."""
        return self.model_dump(mode="json", exclude={"deliveries"})

    def slack_text(self) -> str:
        return f"[{self.severity}] {self.title}: {self.message}"


class Webhook(Spec):
    name: str
    url: str = Field(..., max_length=2048, description="http:// or https:// URL the notifications are POSTed to")
    secret: str = Field(..., min_length=16, max_length=512, description="signs every body (HMAC-SHA256); never shown")
    format: Literal["json", "slack"] = "json"
    kinds: list[Kind] = Field(default_factory=lambda: list(KINDS), description="which notifications")
    tenant: str | None = Field(None, description="only this tenant's budget notifications (alerts never)")
    updated_at: float = Field(default_factory=time.time)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return check_name(v, "webhook name")

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not re.match(r"^https?://[^\s/?#]+", v):
            raise ValueError("a webhook URL starts with http:// or https:// and names a host")
        return v

    @field_validator("tenant")
    @classmethod
    def _tenant(cls, v: str | None) -> str | None:
        return None if v is None else tenant_name(v)

    def takes(self, n: Notification) -> bool:
        if n.kind not in self.kinds:
            return False
        if self.tenant is not None:
            return n.kind != "alert" and n.tenant == self.tenant
        return True

    def shown(self) -> dict:
        """The webhook as the API answers it: never its secret."""
        return self.model_dump(mode="json", exclude={"secret"})
