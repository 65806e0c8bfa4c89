"""`fabricd lab up|down|status|demo`: the whole cluster on this machine, in namespaces.

`up` returns once fabricd, the agent and the gateway answer and the node has registered;
the processes keep running in the background until `down`. `make run` is `up`, the demo,
then waiting for Ctrl-C and `down`.
"""

from __future__ import annotations

import os
from pathlib import Path

import typer

from controlplane.lab.cluster import LabConfig
from controlplane.lab.cluster import down as lab_down
from controlplane.lab.cluster import status as lab_status
from controlplane.lab.cluster import up as lab_up

lab_app = typer.Typer(help="The lab: a whole Fabric cluster in network namespaces on this machine.",
                      no_args_is_help=True, add_completion=False)

StateOpt = typer.Option(Path(".state/lab"), "--state-dir", help="where the lab keeps its state and logs")


def _cfg(state_dir: Path) -> LabConfig:
    return LabConfig(state_dir=state_dir.resolve())


def _need_root() -> None:
    if os.geteuid() != 0:
        typer.echo("error: the lab creates network namespaces and loads BPF programs; run it as root", err=True)
        raise typer.Exit(2)


@lab_app.command()
def up(state_dir: Path = StateOpt) -> None:
    """Clean stale pieces, then build the topology and start fabricd, the agent and the gateway."""
    _need_root()
    try:
        handle = lab_up(_cfg(state_dir), echo=typer.echo)
    except RuntimeError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"lab is up. For fabricctl: source {handle.config.state_dir / 'env'}")


@lab_app.command()
def down(state_dir: Path = StateOpt) -> None:
    """Stop the lab's processes and remove its namespaces, links and pinned maps."""
    _need_root()
    removed = lab_down(_cfg(state_dir))
    for item in removed:
        typer.echo(f"removed {item}")
    left = lab_status(_cfg(state_dir))
    if left:
        typer.echo("still present: " + ", ".join(left), err=True)
        raise typer.Exit(1)
    typer.echo("lab is down; nothing left behind")


@lab_app.command()
def status(state_dir: Path = StateOpt) -> None:
    """List what of the lab exists (namespaces, links, processes, pinned maps)."""
    left = lab_status(_cfg(state_dir))
    for item in left:
        typer.echo(item)
    if not left:
        typer.echo("lab is down")


@lab_app.command()
def demo(state_dir: Path = StateOpt) -> None:
    """Run the newcomer's demo against a lab that is up."""
    from controlplane.lab.demo import run_demo

    run_demo(_cfg(state_dir), echo=typer.echo)
