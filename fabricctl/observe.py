"""`fabricctl ai explain failure REPLICA` and `fabricctl ai explain scaling DEPLOYMENT`."""

from __future__ import annotations

import time

import typer

from fabricctl.output import col, emit_json, emit_table, number, session

JSON_OPT = typer.Option(False, "--json", help="print JSON for scripts")


def _when(e: dict) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e["time"]))


EVENT_COLUMNS = [("TIME", _when), col("TYPE", "type"), col("OBJECT", "object"), col("REASON", "reason"),
                 col("MESSAGE", "message")]


def failure(replica: str = typer.Argument(..., metavar="REPLICA", help="a replica id"), as_json: bool = JSON_OPT) -> None:
    """REPLICA's (or its VM's) recorded history: failed probes, start timeouts, agent errors."""
    with session() as c:
        data = c.get(f"/api/ai/explain/failure/{replica}")
    if as_json:
        emit_json(data)
        return
    current = data.get("current")
    state = f"{current['phase']} on {current['node']}" if current else "gone"
    typer.echo(f"replica {replica}: {state}; {data['failures']} failures recorded; last: {data['summary']}")
    emit_table(data.get("history", []), EVENT_COLUMNS, False)


def scaling(deployment: str = typer.Argument(..., metavar="DEPLOYMENT", help="a deployment"), as_json: bool = JSON_OPT) -> None:
    """What the autoscaler decides for DEPLOYMENT now, the signal and how long each condition held."""
    with session() as c:
        data = c.get(f"/api/ai/explain/scaling/{deployment}")
    if as_json:
        emit_json(data)
        return
    sig = data["signal"]
    typer.echo(f"{deployment}: {data['decision']['summary']}")
    ttft = f"{number(sig['ttft_ms'])} ms" if sig.get("ttft_ms") is not None else "- (no requests in the window)"
    queue = number(float(sig["queue_depth"])) if sig.get("queue_depth") is not None else "-"
    typer.echo(f"replicas {sig['desired']} desired, {sig['ready']} ready, {sig['fresh']} with fresh metrics; "
               f"queue {queue}, TTFT {ttft}")
    rows = [{"condition": k, **v} for k, v in (data.get("conditions") or {}).items()]
    emit_table(rows, [col("CONDITION", "condition"), col("VALUE", "value"), col("THRESHOLD", "threshold"),
                      col("HOLDING", "holding"), col("HELD_S", "held_s"), col("NEEDED_S", "needed_s")], False)
