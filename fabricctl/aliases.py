"""`fabricctl ai alias ...`: stable model names for the gateway's root /v1 (common.model_aliases).

    alias add NAME --endpoint E [--model-name M] | alias list | alias delete NAME
"""

from __future__ import annotations

import typer

from fabricctl.output import col, emit_object, emit_table, session

JSON_OPT = typer.Option(False, "--json", help="print JSON for scripts")
ALIAS_COLUMNS = [col("NAME", "name"), col("ENDPOINT", "endpoint"), col("MODEL_NAME", "model_name")]
alias_app = typer.Typer(help="Model aliases: stable model names routed by the gateway's /v1.", no_args_is_help=True)


@alias_app.command("add")
def alias_add(
    name: str = typer.Argument(..., metavar="NAME", help="the model name clients send"),
    endpoint: str = typer.Option(..., "--endpoint", help="the endpoint that serves it"),
    model_name: str = typer.Option(None, "--model-name", help="the name the replicas serve (default: the "
                                   "endpoint's deployment's model)"),
    as_json: bool = JSON_OPT,
) -> None:
    """Create or replace an alias."""
    body = {"name": name, "endpoint": endpoint, "model_name": model_name}
    with session({"name": "NAME", "endpoint": "--endpoint", "model_name": "--model-name"}) as c:
        made = c.post("/api/ai/aliases", {k: v for k, v in body.items() if v is not None})
    emit_object(made, as_json)


@alias_app.command("list")
def alias_list(as_json: bool = JSON_OPT) -> None:
    """List aliases."""
    with session() as c:
        emit_table(c.get("/api/ai/aliases"), ALIAS_COLUMNS, as_json)


@alias_app.command("delete")
def alias_delete(name: str = typer.Argument(..., metavar="NAME", help="the alias to delete"), as_json: bool = JSON_OPT) -> None:
    """Delete an alias; the gateway stops routing the name within its cache TTL."""
    with session() as c:
        result = c.delete(f"/api/ai/aliases/{name}")
    if as_json:
        emit_object(result or {}, True)
    else:
        typer.echo(f"alias {name} deleted")
