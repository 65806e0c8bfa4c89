"""`fabricctl ai login`: trade the admin password for a bearer token and save it (0600).

The password comes from --password-file, FABRIC_PASSWORD or a prompt, never the command line,
so it stays out of shell history and `ps`.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import typer

from controlplane.fabricctl.client import config_from_env, save_token
from controlplane.fabricctl.output import emit_json, session


def login(
    username: str = typer.Option("admin", "--username"),
    password_file: Path = typer.Option(None, "--password-file", help="e.g. STATE_DIR/admin-password"),
    print_token: bool = typer.Option(False, "--print-token", help="print only the token (for export FABRIC_TOKEN=...)"),
    as_json: bool = typer.Option(False, "--json", help="print JSON for scripts"),
) -> None:
    """Log in as the admin and save the token for later commands."""
    if password_file is not None:
        try:
            password = password_file.read_text().strip()
        except OSError as exc:
            typer.echo(f"error: cannot read {password_file}: {exc.strerror}", err=True)
            raise typer.Exit(1) from None
    elif os.environ.get("FABRIC_PASSWORD"):
        password = os.environ["FABRIC_PASSWORD"]
    else:
        password = typer.prompt("password", hide_input=True)
    with session() as c:
        result = c.post("/api/auth/login", {"username": username, "password": password})
    path = save_token(config_from_env(), result["token"])
    if as_json:
        emit_json(result)
    elif print_token:
        typer.echo(result["token"])
    else:
        expires = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(result["expires_at"]))
        typer.echo(f"logged in as {username}; token saved to {path} (expires {expires})")
