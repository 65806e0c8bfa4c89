"""A bug in a route: 500 with the error shape, its traceback logged exactly once (uvicorn used
to log it a second time after Starlette re-raised), and the 500 counted in the metrics."""

from __future__ import annotations

import logging

import httpx

from common.store.sqlite_store import SqliteStore
from controlplane.app import create_app
from controlplane.settings import FabricdSettings
from controlplane.state import AppState
from lab.rigs.servers import serve_in_thread


def test_a_500_is_answered_logged_once_and_counted(tmp_path, caplog):
    state = AppState(store=SqliteStore(tmp_path / "fabric.db"), state_dir=tmp_path,
                     settings=FabricdSettings(run_controllers=False))
    app = create_app(state)

    @app.get("/boom")
    def boom():
        raise RuntimeError("a bug")

    caplog.set_level(logging.ERROR)
    with serve_in_thread(app) as port:
        resp = httpx.get(f"http://127.0.0.1:{port}/boom")
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    assert resp.status_code == 500
    assert resp.json() == {"error": {"code": "internal", "message": "internal error"}}
    tracebacks = [r for r in caplog.records if r.exc_info]
    assert len(tracebacks) == 1, [r.getMessage() for r in tracebacks]
    assert 'route="/boom",status="500"' in metrics
