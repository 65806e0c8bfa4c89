"""`fabricctl ai finops`: GPU-seconds and tokens per deployment and tenant (GET /api/ai/finops)."""

from __future__ import annotations

import typer

from fabricctl.output import col, emit_json, format_table, session

# No tenant reads "-" (a blank cell would shift the row for anyone reading it by eye or by split()).
TENANT = ("TENANT", lambda r: r.get("tenant") or "-")
DEPLOYMENT_COLUMNS = [col("DEPLOYMENT", "deployment"), TENANT,
                      col("GPU_S_RESERVED", "gpu_seconds_reserved"), col("GPU_S_READY", "gpu_seconds_ready"),
                      col("TOKENS", "tokens")]
TENANT_COLUMNS = [TENANT, col("GPU_S_RESERVED", "gpu_seconds_reserved"),
                  col("GPU_S_READY", "gpu_seconds_ready"), col("TOKENS", "tokens")]


def finops(
    window: float = typer.Option(3600, "--window", help="seconds back from now for GPU-seconds"),
    as_json: bool = typer.Option(False, "--json", help="print JSON for scripts"),
) -> None:
    """GPU-seconds reserved and ready over a window, and the ledger's tokens, per deployment and tenant."""
    with session() as c:
        data = c.get("/api/ai/finops", window=window)
    if as_json:
        emit_json(data)
        return
    typer.echo(f"window {data['window']['seconds']:g} s; tokens from the usage ledger since "
               f"{data['token_window']['seconds']:g} s ago (whole hours; budgets: fabricctl ai budget list)")
    typer.echo(format_table(data["deployments"], DEPLOYMENT_COLUMNS) if data["deployments"] else "(no deployments)")
    typer.echo("")
    typer.echo(format_table(data["tenants"], TENANT_COLUMNS) if data["tenants"] else "(no tenants)")
