"""`fabricctl ai key ...`: inference API keys.

    key create NAME --endpoint E [--model M --tenant T --ttl-secs N --request-quota N
                                  --tokens-per-minute N --max-concurrent N]
    key list | key show KEY | key rotate KEY [--overlap-secs N] | key delete KEY
                                      (KEY: the id or the name; names are unique per endpoint)

create and rotate print the plaintext key once; it cannot be shown again.
"""

from __future__ import annotations

import typer

from fabricctl.output import col, emit_object, emit_table, session

JSON_OPT = typer.Option(False, "--json", help="print JSON for scripts")
KEY_COLUMNS = [col("ID", "id"), col("NAME", "name"), col("PREFIX", "prefix"), col("ENDPOINT", "endpoint"),
               col("MODEL", "model"), col("TENANT", "tenant"), col("USED", "requests_used"),
               col("QUOTA", "request_quota"), col("TPM", "tokens_per_minute"), col("MAX_CONC", "max_concurrent"),
               col("EXPIRED", "expired"), col("ROTATING", "rotating")]

KEY_ARG = typer.Argument(..., metavar="KEY", help="the key's id or its name")
key_app = typer.Typer(help="Scoped inference API keys for the gateway.", no_args_is_help=True)


def _print_secret(created: dict, as_json: bool) -> None:
    if as_json:
        emit_object(created, True)
        return
    typer.echo(f"id: {created['id']}")
    typer.echo(f"endpoint: {created['endpoint']}")
    typer.echo(f"key: {created['key']}")
    typer.echo("store this key now: it is not shown again", err=True)


@key_app.command("create")
def key_create(
    name: str = typer.Argument(..., metavar="NAME", help="a name unique on the endpoint"),
    endpoint: str = typer.Option(..., "--endpoint", help="the one endpoint this key may call"),
    model: str = typer.Option(None, "--model", help="only this model"),
    tenant: str = typer.Option(None, "--tenant", help="owning tenant"),
    ttl_secs: int = typer.Option(0, "--ttl-secs", help="seconds until expiry; 0 never expires"),
    request_quota: int = typer.Option(None, "--request-quota", help="lifetime requests"),
    tokens_per_minute: int = typer.Option(None, "--tokens-per-minute", help="token rate limit"),
    max_concurrent: int = typer.Option(None, "--max-concurrent", help="requests in flight at once"),
    priority: str = typer.Option(None, "--priority", help="band without x-request-priority: low, normal, high"),
    fallback: list[str] = typer.Option(None, "--fallback", help="an external endpoint prompts may leave for"),
    shadow_limit: list[str] = typer.Option(None, "--shadow-limit", help="a limit only reported for this key "
                                           "(shadow mode): tokens_per_minute, max_concurrent, request_quota, "
                                           "FABRIC_<LIMIT>"),
    as_json: bool = JSON_OPT,
) -> None:
    """Create a key; the plaintext is printed once."""
    body = {"name": name, "endpoint": endpoint, "model": model, "tenant": tenant, "ttl_secs": ttl_secs,
            "request_quota": request_quota, "tokens_per_minute": tokens_per_minute,
            "max_concurrent": max_concurrent, "priority": priority, "fallbacks": fallback or None,
            "shadow_limits": shadow_limit or None}
    with session({"priority": "--priority", "fallbacks": "--fallback", "shadow_limits": "--shadow-limit", "name": "NAME", "endpoint": "--endpoint", "model": "--model", "tenant": "--tenant",
                  "ttl_secs": "--ttl-secs", "request_quota": "--request-quota",
                  "tokens_per_minute": "--tokens-per-minute", "max_concurrent": "--max-concurrent"}) as c:
        created = c.post("/api/ai/keys", {k: v for k, v in body.items() if v is not None})
    _print_secret(created, as_json)


@key_app.command("list")
def key_list(as_json: bool = JSON_OPT) -> None:
    """List keys with their usage (never a secret)."""
    with session() as c:
        emit_table(c.get("/api/ai/keys"), KEY_COLUMNS, as_json)


@key_app.command("show")
def key_show(key_id: str = KEY_ARG, as_json: bool = JSON_OPT) -> None:
    """Show one key and its usage."""
    with session() as c:
        emit_object(c.get(f"/api/ai/keys/{key_id}"), as_json)


@key_app.command("rotate")
def key_rotate(
    key_id: str = KEY_ARG,
    overlap_secs: int = typer.Option(3600, "--overlap-secs", help="how long the current secret keeps working"),
    as_json: bool = JSON_OPT,
) -> None:
    """Issue a new secret; the current one stays valid for --overlap-secs."""
    with session() as c:
        rotated = c.post(f"/api/ai/keys/{key_id}/rotate", {"overlap_secs": overlap_secs})
    _print_secret(rotated, as_json)


@key_app.command("delete")
def key_delete(key_id: str = KEY_ARG, as_json: bool = JSON_OPT) -> None:
    """Delete a key; the gateway refuses it from then on."""
    with session() as c:
        result = c.delete(f"/api/ai/keys/{key_id}")
    if as_json:
        emit_object(result or {}, True)
    else:
        typer.echo(f"key {result['id'] if result else key_id} deleted")
