"""How fabricctl prints: tables and `field: value` lines for people; json, yaml, wide or name
with `-o` (`--json` is kept as an alias of `-o json`).

`-o` is added to every command that has a `--json` option by controlplane.fabricctl.formats,
which sets CURRENT (a ContextVar, reset when the command returns) to the chosen format and the
command's resource kind; the emit functions below read it, so a command only calls `emit_table`/`emit_object`/`emit_json` with the server's JSON:

  table (default)  aligned columns           wide  the columns plus the command's `wide` ones
  json / yaml      the server's records      name  KIND/NAME, one a line (kubectl's -o name)

`session()` turns a ClientError into one line "error: MESSAGE" on stderr and the exit status of
controlplane.fabricctl.client.exit_code (1 refused, 2 usage or configuration, 3 unreachable).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import typer
import yaml

from controlplane.fabricctl.client import ClientError, FabricClient, client_from_context, exit_code

Column = tuple[str, Callable[[dict], object]]


@dataclass(frozen=True)
class OutputChoice:
    format: str | None  # None: the human default
    kind: str  # the resource kind the command works on, for -o name


CURRENT: ContextVar[OutputChoice | None] = ContextVar("fabricctl_output", default=None)
DEFAULT_CHOICE = OutputChoice(None, "object")


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


def output_format() -> str | None:
    """The -o format of the running command (None: the human default)."""
    return (CURRENT.get() or DEFAULT_CHOICE).format


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


def dump_yaml(data: object) -> str:
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True).rstrip()


def emit_json(data: object) -> None:
    """The data as JSON, or as YAML under -o yaml."""
    if output_format() == "yaml":
        typer.echo(dump_yaml(data))
    else:
        typer.echo(json.dumps(data, indent=2, sort_keys=True))


def _kind() -> str:
    """The resource kind for -o name: the command's group (`model` in `fabricctl ai model list`)."""
    return (CURRENT.get() or DEFAULT_CHOICE).kind


def object_name(record: dict) -> str:
    for field in ("name", "id", "replica_id", "node"):
        if record.get(field):
            return str(record[field])
    return ""


def emit_table(rows: list[dict], columns: list[Column], as_json: bool = False,
               wide: list[Column] | None = None, kind: str | None = None) -> None:
    fmt = output_format() or ("json" if as_json else None)
    if fmt in ("json", "yaml"):
        emit_json(rows)
    elif fmt == "name":
        for row in rows:
            typer.echo(f"{kind or _kind()}/{object_name(row)}")
    elif not rows:
        typer.echo("(none)")
    else:
        typer.echo(format_table(rows, columns + (wide or []) if fmt == "wide" else columns))


def emit_object(record: dict, as_json: bool = False, kind: str | None = None) -> None:
    fmt = output_format() or ("json" if as_json else None)
    if fmt in ("json", "yaml"):
        emit_json(record)
        return
    if fmt == "name":
        typer.echo(f"{kind or _kind()}/{object_name(record)}")
        return
    lines = flatten(record)
    width = max((len(k) for k, _ in lines), default=0)
    for key, value in lines:
        typer.echo(f"{key.ljust(width)}  {value}")


def fail(message: str, code: int = 1) -> None:
    """Print one error line and exit with code (1 refused, 2 usage, 3 unreachable)."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


@contextmanager
def session(flags: dict[str, str] | None = None) -> Iterator[FabricClient]:
    """A client from flags, environment and context; an error exits with its message and code.
    ``flags`` maps an API field path ("gpu.count") to the flag that set it ("--gpu"), so a
    refusal names the flag the operator typed."""
    try:
        client = client_from_context()
    except ClientError as exc:
        fail(exc.message, exit_code(exc))
    try:
        yield client
    except ClientError as exc:
        fail(exc.in_flags(flags or {}), exit_code(exc))
    finally:
        client.close()
