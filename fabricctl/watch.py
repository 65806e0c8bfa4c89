"""`-w/--watch`: follow changes through fabricd's store watch (GET /api/ai/watch/{family}, one
long poll open at a time; the server answers as soon as something under the family changes).

`start_revision` is read before the first listing so nothing between the listing and the first
poll is missed (a change may then print twice, never zero times). Ctrl-C ends the watch (exit 0).
"""

from __future__ import annotations

from collections.abc import Callable

import typer

from fabricctl.client import FabricClient
from fabricctl.output import Column, emit_json, format_table, object_name, output_format

POLL_S = 30.0


def start_revision(client: FabricClient, family: str) -> int:
    return client.get(f"/api/ai/watch/{family}", revision=0)["revision"]


def follow(client: FabricClient, family: str, revision: int, on_change: Callable[[dict], None],
           max_polls: int | None = None) -> None:
    """Call on_change for every change under family after revision, until Ctrl-C."""
    polls = 0
    try:
        while max_polls is None or polls < max_polls:
            polls += 1
            answer = client.request("GET", f"/api/ai/watch/{family}",
                                    params={"revision": revision, "timeout": POLL_S}, timeout=POLL_S + 10)
            revision = answer["revision"]
            for change in answer["changes"]:
                on_change(change)
    except KeyboardInterrupt:
        raise typer.Exit(0) from None


def print_row(record: dict, columns: list[Column], kind: str) -> None:
    """One changed record: a table row without its header, or JSON/YAML/name under -o."""
    fmt = output_format()
    if fmt in ("json", "yaml"):
        emit_json(record)
    elif fmt == "name":
        typer.echo(f"{kind}/{object_name(record)}")
    else:
        typer.echo(format_table([record], columns).splitlines()[1])


def follow_events(client: FabricClient, kind: str | None, name: str | None, columns: list[Column],
                  revision: int) -> None:
    def on_change(change: dict) -> None:
        ev = change.get("value")
        if change["type"] != "put" or not isinstance(ev, dict):
            return
        if (kind is None or ev.get("kind") == kind) and (name is None or ev.get("name") == name):
            print_row(ev, columns, "event")

    follow(client, "events", revision, on_change)


def follow_records(client: FabricClient, family: str, kind: str, name: str | None, columns: list[Column],
                   revision: int) -> None:
    """Print each changed record of family (only NAME's when given); a deletion prints DELETED."""
    def on_change(change: dict) -> None:
        if name is not None and change["name"] != name:
            return
        if change["type"] == "delete":
            typer.echo(f"{kind}/{change['name']} deleted")
        elif isinstance(change.get("value"), dict):
            print_row(change["value"], columns, kind)

    follow(client, family, revision, on_change)
