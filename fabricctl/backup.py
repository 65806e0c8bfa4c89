"""`fabricctl ai backup` and `fabricctl ai restore FILE [--apply] [--replace]`.

    backup                       print the desired-state backup document (JSON) on stdout
    restore FILE [--apply]       what restoring FILE would do (create / unchanged / conflict);
                  [--replace]    --apply writes it (refused with any conflict unless --replace)

`fabricctl ai backup > fabric-backup.json` then, on another cluster,
`fabricctl ai restore fabric-backup.json` to review and `--apply` to write.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from fabricctl.output import col, emit_table, session

JSON_OPT = typer.Option(False, "--json", help="print JSON for scripts")
CHANGE_COLUMNS = [col("SECTION", "section"), col("NAME", "name"), col("ACTION", "action"),
                  ("DIFFERS", lambda c: ",".join(c.get("differs") or []) or "-")]


def backup() -> None:
    """Print the desired state (models, profiles, deployments, endpoints, keys as digests...) as JSON."""
    with session() as c:
        doc = c.post("/api/ai/backup", {})
    typer.echo(json.dumps(doc, indent=2, sort_keys=True))


def restore(
    path: Path = typer.Argument(..., metavar="FILE", help="a document written by `fabricctl ai backup`"),
    apply: bool = typer.Option(False, "--apply", help="write it (default: only show what would change)"),
    replace: bool = typer.Option(False, "--replace", help="with --apply: overwrite records that differ"),
    as_json: bool = JSON_OPT,
) -> None:
    """Restore a backup into this cluster: a dry run unless --apply."""
    try:
        doc = json.loads(path.read_text())
    except OSError as exc:
        typer.echo(f"error: cannot read {path}: {exc.strerror}", err=True)
        raise typer.Exit(2) from None
    except ValueError as exc:
        typer.echo(f"error: {path} is not JSON: {exc}", err=True)
        raise typer.Exit(2) from None
    params = {"apply": str(apply).lower(), "replace": str(replace).lower()}
    with session() as c:
        result = c.request("POST", "/api/ai/restore", json=doc, params=params)
    if as_json:
        typer.echo(json.dumps(result, indent=2))
        return
    emit_table([ch for ch in result["changes"] if ch["action"] != "unchanged"], CHANGE_COLUMNS)
    s = result["summary"]
    counts = f"{s['create']} to create, {s['conflict']} conflicting, {s['unchanged']} unchanged"
    if apply:
        typer.echo(f"wrote {len(result.get('written', []))} record(s) ({counts})")
    else:
        typer.echo(f"dry run: {counts}; pass --apply to write" + (" (and --replace to overwrite conflicts)"
                                                                  if s["conflict"] else ""))
