"""How fabricctl prints: tables and `field: value` lines for people; json, yaml, wide or name
with `-o` (`--json` is kept as an alias of `-o json`).

`-o` is added to every command that has a `--json` option by fabricctl.formats,
which sets CURRENT (a ContextVar, reset when the command returns) to the chosen format and the
command's resource kind; the emit functions below read it, so a command only calls `emit_table`/`emit_object`/`emit_json` with the server's JSON:

  table (default)  aligned columns           wide  the columns plus the command's `wide` ones
  json / yaml      the server's records      name  KIND/NAME, one a line (kubectl's -o name)

Human output is for people (docs STYLE 15): numbers rounded (never 1.79616e+09), epoch times
as UTC dates with their age, nested records as `a.b` lines, lists of records as tables under the
object, never a Python repr. -o json|yaml print the server's data untouched.

`session()` turns a ClientError into one line "error: MESSAGE" on stderr and the exit status of
fabricctl.client.exit_code (1 refused, 2 usage or configuration, 3 unreachable).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import typer
import yaml

from fabricctl.client import ClientError, FabricClient, client_from_context, exit_code

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


# Fields holding epoch seconds (by name); a number there above this is shown as a date.
TIME_SUFFIXES = ("_at", "_since", "_deadline", "deadline", "heartbeat", "_unix", "expires")
EPOCH_FLOOR = 1e9  # 2001-09-09: smaller values are durations or counts, not times


def is_time_field(name: str, value: object) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and value > EPOCH_FLOOR
            and name.rsplit(".", 1)[-1].endswith(TIME_SUFFIXES))


def age(seconds: float) -> str:
    """3s, 4m, 2h, 5d: the largest unit, whole."""
    s = abs(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{int(s // size)}{unit}"
    return f"{int(s)}s"


def when(epoch: float, now: float | None = None) -> str:
    """``2026-12-01 20:07:47 UTC (3s ago)`` (or ``(in 5m)`` for a time still to come)."""
    now = time.time() if now is None else now
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(epoch))
    return f"{stamp} ({age(now - epoch)} ago)" if epoch <= now else f"{stamp} (in {age(epoch - now)})"


def number(value: float) -> str:
    """A float for people: whole numbers without a point, others to 3 decimals, no exponent."""
    if not math.isfinite(value):
        return str(value)
    if value == int(value):
        return str(int(value))
    if abs(value) < 0.001:
        return f"{value:.2g}"
    return f"{value:.3f}".rstrip("0").rstrip(".")


def format_table(rows: list[dict], columns: list[Column]) -> str:
    cells = [[h for h, _ in columns]] + [[_text(get(r)) for _, get in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells)


def _text(value: object) -> str:
    if isinstance(value, float):
        return number(value)
    if isinstance(value, (list, tuple)):
        return ",".join(_text(v) for v in value)
    if isinstance(value, dict):  # a record inside a list: key=value pairs, never a repr
        return " ".join(f"{k}={_text(v)}" for k, v in value.items() if v not in (None, "", [], {}))
    if value is None:
        return "-"
    return str(value)


def record_lists(record: dict) -> dict[str, list[dict]]:
    """The fields of record that are non-empty lists of records (a node's GPUs): shown as tables."""
    return {k: v for k, v in record.items()
            if isinstance(v, list) and v and all(isinstance(x, dict) for x in v)}


def auto_columns(rows: list[dict]) -> list[Column]:
    """A column per field the rows have that is a plain value (in first-seen order)."""
    names: list[str] = []
    for row in rows:
        names += [k for k, v in row.items() if k not in names and not isinstance(v, (dict, list))]
    return [col(n.upper(), n) for n in names]


def flatten(record: dict, prefix: str = "") -> list[tuple[str, str]]:
    lines: list[tuple[str, str]] = []
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            lines.extend(flatten(value, name + "."))
        elif is_time_field(name, value):
            # Timestamps are epoch seconds on the wire; people read UTC times and ages.
            lines.append((name, when(value)))
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
    for field in ("name", "id", "replica_id", "node", "deployment", "tenant"):
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


def emit_object(record: dict, as_json: bool = False, kind: str | None = None,
                tables: dict[str, list[Column]] | None = None) -> None:
    """`field  value` lines; a field holding a list of records (``tables`` may give its columns)
    becomes a table under them, its line saying how many."""
    fmt = output_format() or ("json" if as_json else None)
    if fmt in ("json", "yaml"):
        emit_json(record)
        return
    if fmt == "name":
        typer.echo(f"{kind or _kind()}/{object_name(record)}")
        return
    nested = record_lists(record)
    lines = flatten({k: (f"{len(v)} (below)" if k in nested else v) for k, v in record.items()})
    width = max((len(k) for k, _ in lines), default=0)
    for key, value in lines:
        typer.echo(f"{key.ljust(width)}  {value}".rstrip())
    for key, rows in nested.items():
        typer.echo(f"\n{key.upper()}")
        typer.echo(format_table(rows, (tables or {}).get(key) or auto_columns(rows)))


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
