"""`fabricctl ai site add|list|show|delete` over /api/ai/sites (docs/sites.md)."""

from __future__ import annotations

import typer

from fabricctl.output import col, emit_object, emit_table, session

site_app = typer.Typer(help="Sites: residency, cost tier, failover sites, peer fabricd.", no_args_is_help=True)
JSON_OPT = typer.Option(False, "--json", help="print JSON for scripts")
NAME_ARG = typer.Argument(..., metavar="NAME", help="the site's name (what agents report as FABRIC_SITE)")
SITE_COLUMNS = [col("NAME", "name"), col("RESIDENCY", "residency"), col("COST_TIER", "cost_tier"),
                col("FAILOVER", "failover_sites"), col("PEER", "peer_url"), col("NODES", "nodes")]


@site_app.command("add")
def site_add(
    name: str = NAME_ARG,
    residency: str = typer.Option(None, "--residency", help="the data-residency zone the site is in"),
    cost_tier: float = typer.Option(1.0, "--cost-tier", help="relative cost, lower is cheaper (cost_optimized)"),
    failover: list[str] = typer.Option(None, "--failover", help="repeatable: where site_local spills when full"),
    peer_url: str = typer.Option(None, "--peer-url", help="that site's fabricd (model replicate)"),
    fail_closed_unix: float = typer.Option(None, "--fail-closed-unix", help="serve a snapshot until this time"),
    region: str = typer.Option("", "--region", help="free text"),
    as_json: bool = JSON_OPT,
) -> None:
    """Record site NAME (replaces an existing record of that name)."""
    body = {"name": name, "residency": residency, "cost_tier": cost_tier, "failover_sites": list(failover or []),
            "peer_url": peer_url, "fail_closed_unix": fail_closed_unix, "region": region}
    with session() as c:
        emit_object(c.post("/api/ai/sites", body), as_json)


@site_app.command("list")
def site_list(as_json: bool = JSON_OPT) -> None:
    """Every site record with the nodes reporting it."""
    with session() as c:
        emit_table(c.get("/api/ai/sites"), SITE_COLUMNS, as_json)


@site_app.command("show")
def site_show(name: str = NAME_ARG, as_json: bool = JSON_OPT) -> None:
    """One site record."""
    with session() as c:
        emit_object(c.get(f"/api/ai/sites/{name}"), as_json)


@site_app.command("delete")
def site_delete(name: str = NAME_ARG, as_json: bool = JSON_OPT) -> None:
    """Forget site NAME's record (its nodes keep reporting the name)."""
    with session() as c:
        result = c.delete(f"/api/ai/sites/{name}")
    if as_json:
        emit_object(result or {}, True)
    else:
        typer.echo(f"site {name} deleted")
