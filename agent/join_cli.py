"""`fabric-agent join` and `fabric-agent renew-cert` (agent.join does the work)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from agent.control_plane import split_urls

DEFAULT_PKI = Path("/var/lib/fabric-agent/pki")
ControlPlanes = Annotated[list[str], typer.Option(
    "--control-plane", help="fabricd URL, repeatable or comma-separated; each is tried in turn")]


CREDENTIAL = "fabric-join-token"  # systemd LoadCredential= name


def read_token(token_file: Path | None, env: dict[str, str]) -> str:
    """The join token from a file (--token-file / $FABRIC_JOIN_TOKEN_FILE), a systemd credential
    ($CREDENTIALS_DIRECTORY/fabric-join-token) or $FABRIC_JOIN_TOKEN, never from argv (which
    every local user can read in /proc and which shells keep in their history)."""
    if token_file is None and env.get("CREDENTIALS_DIRECTORY"):
        candidate = Path(env["CREDENTIALS_DIRECTORY"]) / CREDENTIAL
        token_file = candidate if candidate.is_file() else None
    if token_file is not None:
        try:
            return token_file.read_text().strip()
        except OSError as exc:
            raise ValueError(f"cannot read the join token file {token_file}: {exc.strerror}") from None
    if env.get("FABRIC_JOIN_TOKEN", "").strip():
        return env["FABRIC_JOIN_TOKEN"].strip()
    raise ValueError("no join token: put it in a file (mode 0600) and pass --token-file FILE or "
                     "$FABRIC_JOIN_TOKEN_FILE, or a systemd credential named fabric-join-token, "
                     "or $FABRIC_JOIN_TOKEN; never on the command line")


def join(
    token_file: Annotated[Path | None, typer.Option(
        "--token-file", envvar="FABRIC_JOIN_TOKEN_FILE",
        help="a file holding the token from `fabricctl ai node join-token` (also: a systemd credential "
             "fabric-join-token, or $FABRIC_JOIN_TOKEN); there is no --token: argv is readable by every user")] = None,
    control_plane: ControlPlanes = ...,
    node_id: str = typer.Option(..., "--node-id", help="this node's id (its certificate's CN)"),
    pki_dir: Annotated[Path, typer.Option("--pki-dir", help="where NODE.crt, NODE.key and ca.crt go")] = DEFAULT_PKI,
) -> None:
    """Trade a one-time join token for this node's certificate (its key is made here)."""
    import os

    from agent.join import JoinFailed
    from agent.join import join as do_join

    try:
        token = read_token(token_file, dict(os.environ))
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    try:
        files = do_join(token, node_id, split_urls(control_plane), pki_dir)
    except JoinFailed as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"joined as {node_id}: certificate {files.cert}, key {files.key}, CA {files.ca}")
    typer.echo(f"start the agent: fabric-agent serve --node-id {node_id} --pki-dir {pki_dir} "
               f"--control-plane {','.join(split_urls(control_plane))}")


def renew_cert(
    control_plane: ControlPlanes = ...,
    node_id: str = typer.Option(..., "--node-id"),
    pki_dir: Annotated[Path, typer.Option("--pki-dir")] = DEFAULT_PKI,
    check: bool = typer.Option(False, "--check", help="only say whether renewal is due: exit 0 due, 1 not"),
    force: bool = typer.Option(False, "--force", help="renew even when not due"),
) -> None:
    """Renew this node's certificate with the current one, when a third of its life is left."""
    from agent.join import JoinFailed, node_files, renew, renewal_due

    if check:
        due = renewal_due(node_files(pki_dir, node_id).cert)
        typer.echo("renewal due" if due else "renewal not due")
        raise typer.Exit(0 if due else 1)
    try:
        renewed = renew(node_id, split_urls(control_plane), pki_dir, force=force)
    except JoinFailed as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo("renewed" if renewed else "not due yet")
