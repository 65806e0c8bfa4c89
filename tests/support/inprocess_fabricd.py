"""fabricd's app served in-process (uvicorn in a thread, real HTTP on loopback) over a given
store, for tests that also read or write the store directly (observed state the controllers
would write, or a store of a kind the test chose)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from common.store.base import Store
from controlplane.app import create_app
from controlplane.auth import ensure_admin_password
from controlplane.settings import load
from controlplane.state import AppState
from lab.rigs.servers import serve_in_thread


@contextmanager
def serve_fabricd(store: Store, state_dir: Path, *, controllers_running: bool = False,
                  run_controllers: bool = False, insecure: bool = False,
                  env: dict[str, str] | None = None) -> Iterator[tuple[httpx.Client, AppState]]:
    """``insecure`` lets fabricd call agents over plain HTTP on loopback (fabricd serve --insecure).
    ``env``: the FABRIC_* variables fabricd would start with (controlplane.settings.load), read
    once here as fabricd reads them; the test's own environment is not read. A test changes a
    setting later with ``state.settings = dataclasses.replace(state.settings, ...)``."""
    ensure_admin_password(state_dir)
    settings = load(env or {}, run_controllers=run_controllers, insecure=insecure)
    state = AppState(store=store, state_dir=state_dir, settings=settings)
    state.controllers_running = controllers_running
    with serve_in_thread(create_app(state)) as port:
        password = (state_dir / "admin-password").read_text().strip()
        token = httpx.post(f"http://127.0.0.1:{port}/api/auth/login",
                           json={"username": "admin", "password": password}).json()["token"]
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {token}"},
                          timeout=30) as client:
            yield client, state
