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
from controlplane.settings import FabricdSettings
from controlplane.tenancy.login_gate import LoginGate
from controlplane.watch_gate import WatchGate


@dataclass
class AppState:
    store: Store
    state_dir: Path
    # Every FABRIC_* setting and serve flag, read and validated once at start
    # (controlplane.settings.load): the process's one settings handle. Default: every default.
    settings: FabricdSettings = field(default_factory=FabricdSettings)
    # One registry per app so several apps (tests, several fabricd roles) never collide.
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    # True while controllers from controlplane.controllers run in this process; the API
    # then hands deployment deletion to the reconciler instead of deleting the record itself.
    controllers_running: bool = False
    token_secret: bytes | None = None  # loaded from the store at app start (controlplane.auth)
    # Agent clients for operations that call agents (model verify, cache eviction, MIG); None: made
    # from state_dir's PKI per request. Tests hand in their own.
    agents: object | None = None
    # Password logins: their own executor, a bounded queue and per-account/per-source backoff.
    logins: LoginGate = field(default_factory=LoginGate)
    # Long-poll watches: their own executor, capped per caller and in total.
    watches: WatchGate = field(default_factory=WatchGate)


def get_state(request: Request) -> AppState:
    """FastAPI dependency: the AppState the app was created with."""
    return request.app.state.fabric


# Annotated form for route signatures: `state: StateDep`.
StateDep = Annotated[AppState, Depends(get_state)]
