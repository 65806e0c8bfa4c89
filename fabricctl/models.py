"""`fabricctl ai model status|materialize|jobs|verify|evict|replicate`: the model supply chain.

`materialize NAME --wait` follows the job through the API with a progress bar (rich, on
stderr) until the model is Ready (exit 0) or Failed (exit 1, the job's message on stderr);
without --wait it prints the recorded jobs and returns at once, as the API does (202).
"""

from __future__ import annotations

import time

import typer

from common.model_api import amount
from fabricctl.output import col, emit_object, emit_table, fail, output_format, session

JSON_OPT = typer.Option(False, "--json", help="print JSON for scripts")

JOB_COLUMNS = [col("MODEL", "model"), col("NODE", "node"), col("STATE", "state"),
               ("PROGRESS", lambda j: _progress(j)), col("RETRIES", "retries"), col("MESSAGE", "message")]
NODE_COLUMNS = [col("NODE", "node"), col("STATE", "state"), ("PROGRESS", lambda j: _progress(j)),
                col("CACHED", "cached"), col("DIGEST", "digest"), col("MESSAGE", "message")]


def _progress(job: dict) -> str:
    total = job.get("bytes_total") or 0
    return amount(job.get("bytes_done", 0), total) if total else "-"


def status(name: str = typer.Argument(..., metavar="NAME", help="the model's name"), as_json: bool = JSON_OPT) -> None:
    """A model's state, digest, progress and its cache state on each node."""
    with session() as c:
        s = c.get(f"/api/ai/models/{name}/status")
    if as_json or output_format() in ("json", "yaml", "name"):
        emit_object(s, as_json)
        return
    summary = {k: s.get(k) for k in ("name", "source", "state", "message", "digest", "revision", "files")}
    summary["progress"] = _progress(s)
    emit_object(summary)
    typer.echo("")
    emit_table(s.get("nodes", []), NODE_COLUMNS)


def _follow(c, name: str, timeout: float) -> dict:
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

    deadline = time.monotonic() + timeout
    # The bar goes to stderr: stdout keeps only the result line, for scripts.
    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeElapsedColumn(),
                  transient=False, console=Console(stderr=True)) as bar:
        task = bar.add_task(f"{name}: Registered", total=None)
        while True:
            s = c.get(f"/api/ai/models/{name}/status")
            total = s.get("bytes_total") or None
            bar.update(task, description=f"{name}: {s['state']}", total=total, completed=s.get("bytes_done", 0))
            if s["state"] in ("Ready", "Failed") or time.monotonic() > deadline:
                return s
            time.sleep(0.5)


def materialize(
    name: str = typer.Argument(..., metavar="NAME", help="the model's name"),
    node: list[str] = typer.Option(None, "--node", help="materialize on this node (repeatable; default: every "
                                                        "online node)"),
    wait: bool = typer.Option(False, "--wait", help="follow the job with a progress bar until Ready or Failed"),
    timeout: float = typer.Option(3600, "--timeout", help="seconds --wait waits at most"),
    as_json: bool = JSON_OPT,
) -> None:
    """Record a job that brings the model's bytes onto the nodes and checks them."""
    with session() as c:
        result = c.post(f"/api/ai/models/{name}/materialize", {"nodes": node} if node else {})
        if not wait:
            if as_json or output_format():
                emit_object(result, as_json)
            else:
                emit_table(result["jobs"], JOB_COLUMNS)
            return
        machine = as_json or output_format() in ("json", "yaml")
        if machine:
            deadline = time.monotonic() + timeout
            while (s := c.get(f"/api/ai/models/{name}/status"))["state"] not in ("Ready", "Failed") \
                    and time.monotonic() < deadline:
                time.sleep(0.5)
        else:
            s = _follow(c, name, timeout)
    if machine:
        emit_object(s, True)
    if s["state"] == "Failed":
        fail(f"model {name} failed: {s['message']}")
    if s["state"] != "Ready":
        fail(f"model {name} is still {s['state']} after {timeout:g}s")
    if not machine:
        typer.echo(f"model {name} Ready: digest {s['digest']}")


def jobs(as_json: bool = JSON_OPT) -> None:
    """Every model job (one per model and node) with its state and progress."""
    with session() as c:
        emit_table(c.get("/api/ai/model-jobs"), JOB_COLUMNS, as_json, kind="model-job")


def verify(name: str = typer.Argument(..., metavar="NAME", help="the model's name"), as_json: bool = JSON_OPT) -> None:
    """Hash and scan the cached bytes again on every node where the model is Ready."""
    with session() as c:
        result = c.post(f"/api/ai/models/{name}/verify", {})
    if as_json or output_format():
        emit_object(result, as_json)
    else:
        emit_table(result["results"], [col("NODE", "node"), col("OK", "ok"), col("MESSAGE", "message")])
    if any(r.get("ok") is False for r in result["results"]):
        raise typer.Exit(1)


def evict(
    budget_bytes: int = typer.Option(None, "--budget-bytes", help="per-node cache budget "
                                                                  "(default: fabricd's FABRIC_MODEL_CACHE_BYTES)"),
    as_json: bool = JSON_OPT,
) -> None:
    """Delete least recently used cached models no deployment uses until each node fits the budget."""
    body = {} if budget_bytes is None else {"budget_bytes": budget_bytes}
    with session() as c:
        result = c.post("/api/ai/models/cache/evict", body)
    if as_json or output_format():
        emit_object(result, as_json)
        return
    cols = [col("NODE", "node"), col("DIGEST", "digest"), col("BYTES", "size_bytes"), col("REASON", "reason")]
    typer.echo("evicted:")
    emit_table(result["evicted"], cols)
    typer.echo("kept:")
    emit_table(result["kept"], cols)
    for err in result.get("errors", []):
        typer.echo(f"error: {err}", err=True)


def replicate(
    name: str = typer.Argument(..., metavar="NAME", help="the model's name"),
    site: str = typer.Option(..., "--site", help="the site that should hold the model's bytes"),
    as_json: bool = JSON_OPT,
) -> None:
    """Make the model's bytes present at SITE (a node there has them, or push to its peer fabricd).

    Exit 1 while it stays Pending; the reason is printed."""
    with session() as c:
        result = c.post(f"/api/ai/models/{name}/replicate", {"site": site})
    emit_object(result, as_json)
    if result.get("phase") != "Ready":
        raise typer.Exit(1)


def register(model_app: typer.Typer) -> None:
    for fn in (status, materialize, jobs, verify, evict, replicate):
        model_app.command(fn.__name__)(fn)
