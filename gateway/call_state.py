"""One proxied call's state as it passes GatewayApp.call's stages (gateway/app.py).

Each stage fills the fields it owns, in order: authenticate (route, headers, identity, holder),
read (body, info, tenant_context), resolve (endpoint, deadline, priority, view, label), admit
(placement, facts), pick (pick, explained, used_adapter), reserve (fwd_headers, admission),
forward (status, tokens, outcome, budget). The finish stage reads it whatever stopped the call:
the defaults describe a call refused before anything was known of it (label "unknown", 500, "error").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.dispatch import Placement
from gateway.key_auth import Identity
from gateway.limits import Admission, RequestFacts
from gateway.live_budget import LiveBudget
from gateway.pickers import Pick
from gateway.request_body import BodyInfo
from gateway.routes import Route
from gateway.upstreams import EndpointView


@dataclass(slots=True)
class CallState:
    scope: dict
    receive: Any
    send: Any  # the held SSE stream once a cold start opened it (gateway.hold)
    request_id: str
    t0: float  # perf_counter at the start: the call's latency
    # What finish reports.
    label: str = "unknown"  # the metric label: the endpoint once resolved in the store
    status: int = 500
    tokens: int | None = None  # None: the upstream's usage is unknown
    outcome: str = "error"
    endpoint: str = ""  # the route's, the body's model's at the root /v1, or an external provider's
    identity: Identity | None = None
    admission: Admission | None = None
    info: BodyInfo = field(default_factory=BodyInfo)
    body_read: bool = False  # False: an error answer closes the connection
    holder: str | None = None  # the credential whose calls in progress this one counts in
    budget: LiveBudget | None = None  # a stream's live token count (gateway.live_budget)
    used_adapter: str | None = None  # the LoRA adapter that served the call (the usage row's)
    # What the stages hand on.
    route: Route | None = None
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    tenant_context: int | None = None  # the tenant's max_context_tokens (gateway.tenant_caps)
    deadline: float = 0.0
    priority: str = "normal"  # the call's band
    held_notes: dict = field(default_factory=dict)  # the phase a held call waited in (gateway.cold_start)
    view: EndpointView | None = None
    placement: Placement | None = None
    facts: RequestFacts | None = None
    pick: Pick | None = None
    explained: dict = field(default_factory=dict)  # GET /api/ai/explain/request/{id}
    fwd_headers: list = field(default_factory=list)
    shadowed: int = 0  # shadow refusals counted before the stream (gateway.live_budget adds later ones)
