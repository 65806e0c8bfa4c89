"""`fabric-agent join` and `fabric-agent renew-cert` (agent.join does the work)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from agent.control_plane import split_urls

DEFAULT_PKI = Path("/var/lib/fabric-agent/pki")
ControlPlanes = Annotated[list[str], typer.Option(
    "--control-plane", help="fabricd URL, repeatable or comma-separated; each is tried in turn")]


def join(
    token: str = typer.Option(..., "--token", envvar="FABRIC_JOIN_TOKEN",
                              help="from `fabricctl ai node join-token` (or $FABRIC_JOIN_TOKEN, kept out of argv)"),
    control_plane: ControlPlanes = ...,
    node_id: str = typer.Option(..., "--node-id", help="this node's id (its certificate's CN)"),
    pki_dir: Annotated[Path, typer.Option("--pki-dir", help="where NODE.crt, NODE.key and ca.crt go")] = DEFAULT_PKI,
) -> None:
    """Trade a one-time join token for this node's certificate (its key is made here)."""
    from agent.join import JoinFailed
    from agent.join import join as do_join

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
