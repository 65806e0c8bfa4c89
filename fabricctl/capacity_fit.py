"""`fabricctl ai capacity` as a group: bare, the GPUs by node and site (fabricctl.capacity);
`fit --profile NAME`, how many more replicas of that profile fit now (GET /api/ai/capacity/fit):
per node and site, without preemption and with it per capacity class, and what binds."""

from __future__ import annotations

import typer

from fabricctl import capacity
from fabricctl.formats import with_output
from fabricctl.output import col, emit_json, format_table, session

capacity_app = typer.Typer(help="GPUs by node and site; `fit` answers how many more replicas fit.",
                           invoke_without_command=True)

NODE_COLUMNS = [col("NODE", "node"), col("SITE", "site"), col("FITS", "fits"),
                col("WITH_PREEMPTION_STANDARD", "with_preemption.standard"),
                col("WITH_PREEMPTION_CRITICAL", "with_preemption.critical"), col("BINDING", "binding"),
                col("DETAIL", "detail")]
SITE_COLUMNS = [col("SITE", "site"), col("FITS", "fits"), col("WITH_PREEMPTION_STANDARD", "with_preemption.standard"),
                col("WITH_PREEMPTION_CRITICAL", "with_preemption.critical"), col("BINDING", "binding")]


def main(ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """Free and total GPUs by node and by site."""
    if ctx.invoked_subcommand is None:
        capacity.capacity(as_json)


# A group's callback is not given -o by add_output_options: the bare command keeps it here.
capacity_app.callback(invoke_without_command=True)(with_output(main, "capacity"))


@capacity_app.command("fit")
def fit(profile: str = typer.Option(..., "--profile", help="the profile a replica would use"),
        model: str = typer.Option("", "--model", help="check the nodes' free disk against this model's size"),
        allowed_sites: str = typer.Option("", "--allowed-sites", help="comma-separated sites the replicas may use"),
        residency: str = typer.Option("", "--residency", help="a residency the sites must be in"),
        tenant: str = typer.Option("", "--tenant", help="also the room this tenant's quota leaves"),
        as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """How many more replicas of PROFILE fit now, per node and site, without and with preemption."""
    with session() as c:
        data = c.get("/api/ai/capacity/fit", profile=profile, model=model or None, allowed_sites=allowed_sites or None,
                     residency=residency or None, tenant=tenant or None)
    if as_json:
        emit_json(data)
        return
    more = data["with_preemption"]
    typer.echo(f"{data['fits']} more replica(s) of {data['profile']} fit now; with preemption: "
               f"{more.get('standard', 0)} as standard, {more.get('critical', 0)} as critical"
               + (f" (binding on most nodes: {data['binding']})" if data.get("binding") else ""))
    room = data.get("tenant")
    if room:
        left = ", ".join(f"{what} {'unlimited' if v is None else f'{v:g}'}" for what, v in room["room"].items())
        typer.echo(f"tenant {room['tenant']}: {room['fits_for_tenant']} of them within its quota "
                   f"({left} left)" if room["quota"] else f"tenant {room['tenant']}: no quota (not limited)")
    typer.echo(format_table(data["sites"], SITE_COLUMNS) if data["sites"] else "(no sites)")
    typer.echo("")
    typer.echo(format_table(data["nodes"], NODE_COLUMNS) if data["nodes"] else "(no nodes)")
