"""`fabricctl ai login`: trade a password (admin, viewer or a local user's: --username) or an
identity provider's ID token (--id-token-file, OIDC) for a bearer token and save it in the
current context of ~/.config/fabric/config (0600), creating the context from the URL and CA in use.

The password comes from --password-file, FABRIC_PASSWORD or a prompt, never the command line,
so it stays out of shell history and `ps`. An exported FABRIC_TOKEN overrides the saved token
(environment beats context), so login warns when one is set.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import typer

from fabricctl.client import resolve_config
from fabricctl.contexts import DEFAULT_CONTEXT, ConfigError, Context, load, save
from fabricctl.output import emit_json, fail, session
from fabricctl.settings import current


def save_token(token: str) -> tuple[Path, str]:
    """Store token (with the URL and CA in use) in the current context; returns (file, context)."""
    resolved = resolve_config()
    try:
        cfg = load(resolved.config_path)
    except ConfigError as exc:
        fail(str(exc), 2)
    name = resolved.context or DEFAULT_CONTEXT
    ctx = cfg.contexts.get(name, Context())
    cfg.contexts[name] = dataclasses.replace(ctx, url=resolved.url, token=token,
                                             ca=str(resolved.ca.resolve()) if resolved.ca else ctx.ca)
    cfg.current = cfg.current or name
    save(cfg)
    return cfg.path, name


def login(
    username: str = typer.Option("admin", "--username", help="user to log in as"),
    password_file: Path = typer.Option(None, "--password-file", help="read the password from this file, e.g. "
                                                                     "STATE_DIR/admin-password"),
    print_token: bool = typer.Option(False, "--print-token", help="print only the token (for export FABRIC_TOKEN=...)"),
    as_json: bool = typer.Option(False, "--json", help="print JSON for scripts"),
    id_token_file: Path = typer.Option(None, "--id-token-file", help="sign in with your identity provider's "
                                                                     "ID token in this file (OIDC) instead"),
) -> None:
    """Log in and save the token in the current context for later commands."""
    if id_token_file is not None:
        try:
            id_token = id_token_file.read_text().strip()
        except OSError as exc:
            fail(f"--id-token-file {id_token_file}: {exc.strerror}", 2)
        with session() as c:
            result = c.post("/api/auth/oidc", {"id_token": id_token})
        username = f"{result.get('role')} (OIDC)"
        _saved(result, username, as_json, print_token)
        return
    if password_file is not None:
        try:
            password = password_file.read_text().strip()
        except OSError as exc:
            fail(f"--password-file {password_file}: {exc.strerror}", 2)
    else:
        password = current().password or typer.prompt("password", hide_input=True)
    with session() as c:
        result = c.post("/api/auth/login", {"username": username, "password": password})
    _saved(result, username, as_json, print_token)


def _saved(result: dict, username: str, as_json: bool, print_token: bool) -> None:
    path, context = save_token(result["token"])
    if current().token:
        typer.echo("warning: FABRIC_TOKEN is set in this shell and overrides the saved token; "
                   "`unset FABRIC_TOKEN` to use it", err=True)
    if as_json:
        emit_json(result)
    elif print_token:
        typer.echo(result["token"])
    else:
        expires = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(result["expires_at"]))
        typer.echo(f"logged in as {username}; token saved to context {context} in {path} (expires {expires})")
