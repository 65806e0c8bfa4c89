"""What a running fabricd process holds: passed into the FastAPI app, never imported as a global.

Route handlers reach it through the `get_state` dependency; background controllers receive it
from the app's lifespan (`controlplane.controllers.start(state)`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

from fastapi import Depends, Request
from prometheus_client import CollectorRegistry

from common.store.base import Store
from controlplane.tenancy.login_gate import LoginGate
from controlplane.watch_gate import WatchGate

DEFAULT_TOKEN_TTL_S = 12 * 3600
DEFAULT_EVENTS_KEPT = 1000
DEFAULT_MAX_BODY_BYTES = 1024 * 1024  # fabricd refuses larger request bodies with 413


@dataclass(frozen=True)
class Settings:
    token_ttl_s: int = DEFAULT_TOKEN_TTL_S  # lifetime of an admin bearer token
    events_kept: int = DEFAULT_EVENTS_KEPT  # older events are trimmed from the store
    events_max_age_s: float = 7 * 86400.0  # and events older than this
    insecure: bool = False  # serving plain HTTP on loopback (fabricd serve --insecure)
    run_controllers: bool = True  # False: an API-only process (fabricd serve --no-controllers)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES  # larger request bodies get 413 (FABRIC_MAX_BODY_BYTES)


@dataclass
class AppState:
    store: Store
    state_dir: Path
    settings: Settings = field(default_factory=Settings)
    # One registry per app so several apps (tests, several fabricd roles) never collide.
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    # True while controllers from controlplane.controllers run in this process; the API
    # then hands deployment deletion to the reconciler instead of deleting the record itself.
    controllers_running: bool = False
    token_secret: bytes | None = None  # loaded from the store at app start (controlplane.auth)
    # Agent clients for API routes that call agents (model verify, cache eviction); None: made
    # from state_dir's PKI per request. Tests hand in their own.
    agents: object | None = None
    # Every FABRIC_* setting, validated at start (controlplane.settings.load); None in tests that
    # build an AppState by hand: controlplane.settings.of(state) then gives every default.
    config: object | None = None
    # Password logins: their own executor, a bounded queue and per-account/per-source backoff.
    logins: LoginGate = field(default_factory=LoginGate)
    # Long-poll watches: their own executor, capped per caller and in total.
    watches: WatchGate = field(default_factory=WatchGate)


def get_state(request: Request) -> AppState:
    """FastAPI dependency: the AppState the app was created with."""
    return request.app.state.fabric


# Annotated form for route signatures: `state: StateDep`.
StateDep = Annotated[AppState, Depends(get_state)]
