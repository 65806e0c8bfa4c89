"""`fabricctl ai capacity` and the live routing view used by `fabricctl ai endpoint show`.

capacity prints free/total GPUs per node and per site (GET /api/ai/capacity).
``endpoint_view(client, name)`` returns the endpoint record enriched with its VIP, replicas and
live weights (GET /api/ai/explain/routing/{name}); `fabricctl ai endpoint show` can call it.
"""

from __future__ import annotations

import typer

from fabricctl.client import ClientError
from fabricctl.output import col, emit_json, emit_object, format_table, session

NODE_COLUMNS = [col("NODE", "node"), col("SITE", "site"), col("ONLINE", "online"), col("GPUS_FREE", "gpus_free"),
                col("GPUS_TOTAL", "gpus_total"), col("RESERVED", "gpus_reserved"), col("CPU_FREE", "cpu_free"),
                col("MEM_FREE_GIB", "memory_free_gib")]
SITE_COLUMNS = [col("SITE", "site"), col("NODES", "nodes"), col("GPUS_FREE", "gpus_free"),
                col("GPUS_TOTAL", "gpus_total")]
REPLICA_COLUMNS = [col("REPLICA", "replica_id"), col("INCLUDED", "included"), col("WEIGHT", "weight"),
                   col("HOST", "host"), col("PORT", "port"), col("REASON", "reason")]


def capacity(as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """Free and total GPUs by node and by site."""
    with session() as c:
        data = c.get("/api/ai/capacity")
    if as_json:
        emit_json(data)
        return
    typer.echo(f"GPUs free {data['gpus_free']} of {data['gpus_total']}")
    typer.echo(format_table(data["sites"], SITE_COLUMNS) if data["sites"] else "(no sites)")
    typer.echo("")
    typer.echo(format_table(data["nodes"], NODE_COLUMNS) if data["nodes"] else "(no nodes)")


def endpoint_view(client, name: str) -> dict:
    """The endpoint record plus its live routing (replicas, inclusion reasons, weights)."""
    record = client.get(f"/api/ai/endpoints/{name}")
    routing = client.get(f"/api/ai/explain/routing/{name}")
    record["routing_view"] = {"vip": routing["vip"], "replicas": routing["replicas"],
                              "backends": routing["backends"]}
    return record


def _endpoint_hint(client, name: str) -> str:
    """For `endpoint show DEPLOYMENT`: the endpoints that expose a deployment of that name."""
    try:
        exposing = [e["name"] for e in client.get("/api/ai/endpoints") if e.get("deployment") == name]
    except ClientError:
        return ""
    if not exposing:
        return ""
    return (f"; {name} is a deployment, exposed as endpoint {', '.join(exposing)}: "
            f"fabricctl ai endpoint show {exposing[0]}")


def endpoint_show(name: str = typer.Argument(..., metavar="NAME", help="the endpoint's name"), as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """An endpoint with its VIP, replicas and live Maglev weights."""
    with session() as c:
        try:
            record = endpoint_view(c, name)
        except ClientError as exc:
            raise ClientError(exc.status, exc.code, exc.message + (_endpoint_hint(c, name) if exc.status == 404 else ""),
                              exc.fields) from None
    if as_json:
        emit_json(record)
        return
    replicas = record.pop("routing_view")["replicas"]
    emit_object(record, False)
    typer.echo("")
    typer.echo(format_table(replicas, REPLICA_COLUMNS) if replicas else "(no replicas)")
