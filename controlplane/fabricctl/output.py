"""How fabricctl prints: aligned tables and `field: value` lines for people, JSON with --json.

Commands call `emit_table`/`emit_object` with the server's JSON and `run` to turn a ClientError
into "error: MESSAGE" on stderr with a non-zero exit status.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import typer

from controlplane.fabricctl.client import ClientError, FabricClient, client_from_env

Column = tuple[str, Callable[[dict], object]]


def dig(record: dict, dotted: str, default: object = "") -> object:
    """record["a"]["b"] for "a.b", or default when any part is missing or None."""
    cur: object = record
    for part in dotted.split("."):
        if not isinstance(cur, dict) or cur.get(part) is None:
            return default
        cur = cur[part]
    return cur


def col(header: str, dotted: str) -> Column:
    return header, lambda r: dig(r, dotted)


def format_table(rows: list[dict], columns: list[Column]) -> str:
    cells = [[h for h, _ in columns]] + [[_text(get(r)) for _, get in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells)


def _text(value: object) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return ",".join(_text(v) for v in value)
    return str(value)


def flatten(record: dict, prefix: str = "") -> list[tuple[str, str]]:
    lines: list[tuple[str, str]] = []
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            lines.extend(flatten(value, name + "."))
        elif key.endswith("_at") and isinstance(value, (int, float)) and value > 0:
            # Timestamps are epoch seconds on the wire; people read UTC times.
            lines.append((name, time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(value))))
        else:
            lines.append((name, _text(value) if value is not None else "-"))
    return lines


def emit_json(data: object) -> None:
    typer.echo(json.dumps(data, indent=2, sort_keys=True))


def emit_table(rows: list[dict], columns: list[Column], as_json: bool) -> None:
    if as_json:
        emit_json(rows)
    elif not rows:
        typer.echo("(none)")
    else:
        typer.echo(format_table(rows, columns))


def emit_object(record: dict, as_json: bool) -> None:
    if as_json:
        emit_json(record)
        return
    lines = flatten(record)
    width = max((len(k) for k, _ in lines), default=0)
    for key, value in lines:
        typer.echo(f"{key.ljust(width)}  {value}")


@contextmanager
def session() -> Iterator[FabricClient]:
    """A client from the environment; a server or transport error exits 1 with its message."""
    client = client_from_env()
    try:
        yield client
    except ClientError as exc:
        typer.echo(f"error: {exc.message}", err=True)
        raise typer.Exit(1) from None
    finally:
        client.close()
