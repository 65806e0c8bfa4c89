"""`fabricctl ai identity-mapping ...` and `fabricctl ai tenant-limits ...` (docs/gateway.md, docs/tenancy.md).

    identity-mapping add NAME --claim C --value V [--endpoint E ...] [--issuer I] [--tenant T]
    identity-mapping list | show NAME | delete NAME
    tenant-limits set TENANT --max-context-tokens N | list | delete TENANT
"""

from __future__ import annotations

import typer

from fabricctl.output import col, emit_object, emit_table, session

JSON_OPT = typer.Option(False, "--json", help="print JSON for scripts")
MAPPING_COLUMNS = [col("NAME", "name"), col("CLAIM", "claim"), col("VALUE", "value"),
                   col("ENDPOINTS", "endpoints"), col("TENANT", "tenant"), col("ISSUER", "issuer")]
LIMIT_COLUMNS = [col("TENANT", "tenant"), col("MAX_CONTEXT_TOKENS", "max_context_tokens")]
mapping_app = typer.Typer(help="Identity mappings: an OIDC token's groups or roles -> gateway endpoints.",
                          no_args_is_help=True)
limits_app = typer.Typer(help="Per-tenant gateway limits: max_context_tokens.", no_args_is_help=True)
MAPPING_FLAGS = {"name": "NAME", "claim": "--claim", "value": "--value", "endpoints": "--endpoint",
                 "issuer": "--issuer", "tenant": "--tenant"}


@mapping_app.command("add")
def mapping_add(
    name: str = typer.Argument(..., metavar="NAME", help="a DNS label naming the mapping"),
    claim: str = typer.Option(..., "--claim", help="claim name or dotted path: groups, roles, realm_access.roles"),
    value: str = typer.Option(..., "--value", help="the group or role it must hold: /ml-team, a group GUID, ml-user"),
    endpoint: list[str] = typer.Option(None, "--endpoint", help="an endpoint it grants (repeat; * for all)"),
    issuer: str = typer.Option(None, "--issuer", help="only tokens from this issuer (default: any provider)"),
    tenant: str = typer.Option(None, "--tenant", help="the tenant a matched caller acts as (its endpoints too)"),
    as_json: bool = JSON_OPT,
) -> None:
    """Create or replace a mapping; the gateway applies it within its cache TTL."""
    body = {"name": name, "claim": claim, "value": value, "endpoints": list(endpoint or []),
            "issuer": issuer, "tenant": tenant}
    with session(MAPPING_FLAGS) as c:
        made = c.post("/api/ai/identity-mappings", {k: v for k, v in body.items() if v is not None})
    emit_object(made, as_json)


@mapping_app.command("list")
def mapping_list(as_json: bool = JSON_OPT) -> None:
    """Every identity mapping, by name."""
    with session() as c:
        emit_table(c.get("/api/ai/identity-mappings"), MAPPING_COLUMNS, as_json)


@mapping_app.command("show")
def mapping_show(name: str = typer.Argument(..., metavar="NAME", help="the mapping to show"), as_json: bool = JSON_OPT) -> None:
    """One identity mapping."""
    with session() as c:
        emit_object(c.get(f"/api/ai/identity-mappings/{name}"), as_json)


@mapping_app.command("delete")
def mapping_delete(name: str = typer.Argument(..., metavar="NAME", help="the mapping to delete"), as_json: bool = JSON_OPT) -> None:
    """Delete a mapping; callers it admitted are refused within the gateway's cache TTL."""
    with session() as c:
        result = c.delete(f"/api/ai/identity-mappings/{name}")
    if as_json:
        emit_object(result, True)
    else:
        typer.echo(f"identity mapping {name} deleted")


@limits_app.command("set")
def limits_set(
    tenant: str = typer.Argument(..., metavar="TENANT", help="the tenant whose limits to set"),
    max_context_tokens: int = typer.Option(..., "--max-context-tokens",
                                           help="prompt + max_tokens per call (the gateway's FABRIC_MAX_CONTEXT "
                                                "still applies when tighter)"),
    as_json: bool = JSON_OPT,
) -> None:
    """Set (replace) a tenant's gateway limits."""
    with session({"tenant": "TENANT", "max_context_tokens": "--max-context-tokens"}) as c:
        made = c.post("/api/ai/tenant-limits", {"tenant": tenant, "max_context_tokens": max_context_tokens})
    emit_object(made, as_json)


@limits_app.command("list")
def limits_list(as_json: bool = JSON_OPT) -> None:
    """Every tenant's gateway limits."""
    with session() as c:
        emit_table(c.get("/api/ai/tenant-limits"), LIMIT_COLUMNS, as_json)


@limits_app.command("delete")
def limits_delete(tenant: str = typer.Argument(..., metavar="TENANT", help="the tenant whose limits to remove"),
                  as_json: bool = JSON_OPT) -> None:
    """Remove a tenant's limits: the gateway-wide ones apply."""
    with session() as c:
        result = c.delete(f"/api/ai/tenant-limits/{tenant}")
    if as_json:
        emit_object(result, True)
    else:
        typer.echo(f"tenant {tenant} limits removed")
