"""The web console at /app/ai: server-rendered Jinja2 pages with htmx, served by fabricd.

    install(app)   mounts /app/ai/static (htmx, copied there from npm by scripts/setup.sh; CSS) and the page and action
                   routes, and keeps the charts' history in {state_dir}/console-history.json.gz (controlplane.history_file)

Every read and every write goes through the REST API in-process (controlplane.console.backend),
with the signed-in operator's own token, so the console can do nothing the API would not let
that operator do, and every rule lives in one place. See docs/console.md.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

STATIC_DIR = Path(__file__).parent / "static"
PREFIX = "/app/ai"


def install(app: FastAPI) -> None:
    from controlplane.console import actions, daily, forms, pages, playground
    from controlplane.history import HISTORY
    from controlplane.history_file import FILE_NAME, HistoryFile

    state_dir = getattr(app.state.fabric, "state_dir", None)
    if state_dir is not None and Path(state_dir).is_dir():  # the charts survive a restart
        sink = HistoryFile(Path(state_dir) / FILE_NAME)
        sink.load_into(HISTORY)
        HISTORY.attach(sink)

    app.mount(f"{PREFIX}/static", StaticFiles(directory=STATIC_DIR), name="console-static")
    app.include_router(forms.router)  # first: /deployments/new before /deployments/{name}
    app.include_router(playground.router)
    app.include_router(pages.router)
    app.include_router(actions.router)
    app.include_router(daily.router)
    # Last: any other console address is a page saying so (HTML), not the API's JSON 404.
    app.add_api_route(f"{PREFIX}/{{rest:path}}", pages.not_found, methods=["GET"], include_in_schema=False)
