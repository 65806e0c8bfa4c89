"""`fabricctl ai finops`: GPU-seconds and tokens per deployment and tenant (GET /api/ai/finops)."""

from __future__ import annotations

import typer

from controlplane.fabricctl.output import col, emit_json, format_table, session

# No tenant reads "-" (a blank cell would shift the row for anyone reading it by eye or by split()).
TENANT = ("TENANT", lambda r: r.get("tenant") or "-")
DEPLOYMENT_COLUMNS = [col("DEPLOYMENT", "deployment"), TENANT,
                      col("GPU_S_RESERVED", "gpu_seconds_reserved"), col("GPU_S_READY", "gpu_seconds_ready"),
                      col("TOKENS", "tokens"), col("ALERT", "alert")]
TENANT_COLUMNS = [TENANT, col("GPU_S_RESERVED", "gpu_seconds_reserved"),
                  col("GPU_S_READY", "gpu_seconds_ready"), col("TOKENS", "tokens"), col("ALERT", "alert")]


def finops(
    window: float = typer.Option(3600, "--window", help="seconds back from now for GPU-seconds"),
    as_json: bool = typer.Option(False, "--json", help="print JSON for scripts"),
) -> None:
    """GPU-seconds reserved and ready over a window, and this token window's tokens, per deployment and tenant."""
    with session() as c:
        data = c.get("/api/ai/finops", window=window)
    if as_json:
        emit_json(data)
        return
    budget = data["token_budget"]
    typer.echo(f"window {data['window']['seconds']:g} s; token budget {budget if budget else 'none'}"
               + ("; ALERT: tokens over budget" if data["alert"] else ""))
    typer.echo(format_table(data["deployments"], DEPLOYMENT_COLUMNS) if data["deployments"] else "(no deployments)")
    typer.echo("")
    typer.echo(format_table(data["tenants"], TENANT_COLUMNS) if data["tenants"] else "(no tenants)")
