"""`fabricctl ai apply|get|delete`: declarative documents (kinds: controlplane.api.documents).

    ai apply -f FILE|DIR|- [-f ...] [--dry-run]   create or update; prints each object's action and,
                                                 for an update (or --dry-run), the server's diff
    ai get KIND [NAME] [-w] [-o yaml|json|...]  -o yaml/json print documents that apply takes back
    ai delete -f FILE|DIR|- [--wait]             delete what the documents name, dependents first

A DIR means its *.yaml, *.yml and *.json files in name order; `-` reads stdin. A file holds one
or more YAML documents (`---`), or a JSON document or list. Examples: docs/examples/.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
import yaml

from fabricctl import resources
from fabricctl.client import ClientError
from fabricctl.output import (
    col,
    dump_yaml,
    emit_json,
    emit_table,
    fail,
    output_format,
    session,
)
from fabricctl.wait import TIMEOUT_OPT, WAIT_OPT, gone, wait_until
from fabricctl.watch import follow_records, start_revision

FILE_OPT = typer.Option(..., "-f", "--filename", help="a YAML/JSON file, a directory of them, or - for stdin")
JSON_OPT = typer.Option(False, "--json", help="print JSON for scripts")
SUFFIXES = (".yaml", ".yml", ".json")
# Human tables for the built-in kinds; a kind without an entry shows NAME, PHASE and MESSAGE.
TABLES = {
    "models": (resources.MODEL_COLUMNS, resources.MODEL_WIDE),
    "profiles": (resources.PROFILE_COLUMNS, resources.PROFILE_WIDE),
    "deployments": (resources.DEPLOYMENT_COLUMNS, resources.DEPLOYMENT_WIDE),
    "endpoints": (resources.ENDPOINT_COLUMNS, resources.ENDPOINT_WIDE),
}
# Any other kind is shown from its documents: the name and the spec as key=value.
GENERIC = ([col("NAME", "metadata.name"),
            ("SPEC", lambda d: " ".join(f"{k}={json.dumps(v) if not isinstance(v, str) else v}"
                                        for k, v in (d.get("spec") or {}).items()))], [])


def read_documents(paths: list[str]) -> tuple[list[dict], list[str]]:
    """(documents, where each came from) from files, directories or stdin; exits 2 naming a bad one."""
    docs: list[dict] = []
    sources: list[str] = []
    for given in paths:
        if given == "-":
            files = [("stdin", sys.stdin.read())]
        else:
            path = Path(given)
            if path.is_dir():
                names = sorted(p for p in path.iterdir() if p.suffix in SUFFIXES and p.is_file())
            elif path.is_file():
                names = [path]
            else:
                fail(f"-f {given}: no such file or directory", 2)
            files = []
            for p in names:
                try:
                    files.append((str(p), p.read_text()))
                except (OSError, UnicodeDecodeError) as exc:
                    fail(f"-f {p}: {getattr(exc, 'strerror', None) or exc}", 2)
        for name, text in files:
            try:
                loaded = [d for d in yaml.safe_load_all(text) if d is not None]
            except yaml.YAMLError as exc:
                mark = getattr(exc, "problem_mark", None)
                at = f" line {mark.line + 1}" if mark is not None else ""
                fail(f"{name}{at}: not YAML: {getattr(exc, 'problem', None) or exc}", 2)
            for doc in loaded:
                for item in doc if isinstance(doc, list) else [doc]:
                    docs.append(item)
                    sources.append(f"{name}#{len([s for s in sources if s.startswith(name + '#')]) + 1}")
    if not docs:
        fail(f"no documents in {', '.join(paths)}", 2)
    return docs, sources


def _value(v: object) -> str:
    return json.dumps(v) if not isinstance(v, str) else v


def apply(
    filename: list[str] = FILE_OPT,
    dry_run: bool = typer.Option(False, "--dry-run", help="print what would change (the server's diff); "
                                                           "write nothing"),
    as_json: bool = JSON_OPT,
) -> None:
    """Create or update the objects the documents describe (create-or-update, server-side diff)."""
    documents, sources = read_documents(filename)
    with session() as c:
        answer = c.post("/api/ai/apply", {"documents": documents, "sources": sources, "dry_run": dry_run})
    if as_json:
        emit_json(answer)
        return
    suffix = " (dry run)" if dry_run else ""
    for r in answer["results"]:
        typer.echo(f"{r['kind'].lower()}/{r['name']} {r['action']}{suffix}")
        for d in r["diff"]:
            typer.echo(f"  {d['field']}: {_value(d['from'])} -> {_value(d['to'])}")


def _kinds(c) -> list[dict]:
    return c.get("/api/ai/kinds")


def _find(kinds: list[dict], name: str) -> dict:
    lowered = name.lower()
    for k in kinds:
        if lowered in (k["kind"].lower(), k["plural"], *k["aliases"]):
            return k
    fail(f"KIND: unknown kind {name!r}; one of {', '.join(k['plural'] for k in kinds)}", 2)


def get(
    kind: str = typer.Argument(..., metavar="KIND", help="models, profiles, deployments, endpoints (or the kind, "
                                                         "singular or short name)"),
    name: str = typer.Argument(None, metavar="[NAME]", help="one object; all of the kind without it"),
    watch: bool = typer.Option(False, "--watch", "-w", help="then print each change as it happens"),
    as_json: bool = JSON_OPT,
) -> None:
    """List objects of a kind, or show one; -o yaml/json print documents `apply -f` takes back."""
    fmt = output_format()
    with session() as c:
        k = _find(_kinds(c), kind)
        revision = start_revision(c, k["plural"]) if watch else 0
        if fmt in ("json", "yaml"):
            path = f"/api/ai/documents/{k['plural']}" + (f"/{name}" if name else "")
            data = c.get(path)
            if fmt == "yaml" and isinstance(data, list):
                typer.echo("\n---\n".join(dump_yaml(d) for d in data) if data else "")
            else:
                emit_json(data)
        elif k["plural"] in TABLES:
            rows = [c.get(f"/api/ai/{k['plural']}/{name}")] if name else c.get(f"/api/ai/{k['plural']}")
            columns, wide = TABLES[k["plural"]]
            emit_table(rows, columns, False, wide=wide, kind=k["kind"].lower())
        else:
            path = f"/api/ai/documents/{k['plural']}" + (f"/{name}" if name else "")
            rows = [c.get(path)] if name else c.get(path)
            if fmt == "name":
                rows = [{"name": r["metadata"]["name"]} for r in rows]
            emit_table(rows, GENERIC[0], False, kind=k["kind"].lower())
        if watch:
            follow_records(c, k["plural"], k["kind"].lower(), name, TABLES.get(k["plural"], GENERIC)[0], revision)


def delete(
    filename: list[str] = FILE_OPT,
    wait: bool = WAIT_OPT,
    timeout: float = TIMEOUT_OPT,
) -> None:
    """Delete the objects the documents name (dependents first); a missing one is reported and skipped."""
    documents, _ = read_documents(filename)
    with session() as c:
        kinds = _kinds(c)
        order = {k["kind"]: i for i, k in enumerate(kinds)}
        targets = []
        for doc in documents:
            k = _find(kinds, str(doc.get("kind", "")) if isinstance(doc, dict) else "")
            name = ((doc.get("metadata") or {}).get("name")) if isinstance(doc, dict) else None
            if not name:
                fail(f"a {k['kind']} document has no metadata.name", 2)
            targets.append((order[k["kind"]], k, str(name)))
        for _, k, name in sorted(targets, key=lambda t: -t[0]):
            if not k.get("deletable", True):
                typer.echo(f"{k['kind'].lower()}/{name} skipped: a {k['kind']} cannot be deleted through the API")
                continue
            try:
                result = c.delete(f"/api/ai/{k['plural']}/{name}")
            except ClientError as exc:
                if exc.status != 404:
                    raise
                typer.echo(f"{k['kind'].lower()}/{name} not found (skipped)")
                continue
            # A deployment goes away after its replicas (202, phase Deleting): its model and profile,
            # deleted next, are in use until then, so wait for it whether or not --wait was given.
            if wait or (isinstance(result, dict) and not result.get("deleted")):
                wait_until(c, k["plural"], name, gone, timeout)
            typer.echo(f"{k['kind'].lower()}/{name} deleted")


def register(ai: typer.Typer) -> None:
    ai.command("apply")(apply)
    ai.command("get")(get)
    ai.command("delete")(delete)
