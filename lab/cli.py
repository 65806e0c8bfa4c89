"""`fabric-lab up|down|status|demo`: the whole cluster on this machine, in namespaces.

The lab keeps its state in one absolute place, $FABRIC_LAB_STATE or /var/lib/fabric/lab
(lab.cluster.lab_state_dir), so every command works from any directory and `down`
stops what `up` started wherever either ran. `up` on a lab that is up refuses (exit 1) rather
than wipe its deployments, endpoints, keys and tenants; `--force` takes it down first. `up` returns once fabricd, the agent and the
gateway answer and the node has registered; the processes keep running in the background until
`down`, which prints each thing it removed. `demo` can run again: it reuses the objects it made.
`up` picks the replicas' engine as `make run` does (FABRIC_LAB_ENGINE, else the real vLLM when
installed) and records it in lab.json, where `demo` reads it.
`make run` is `up`, the demo, then waiting for Ctrl-C and `down`; on a lab that is up it attaches
(shows the demo's state, and Ctrl-C leaves the lab to whoever started it).
Run lab commands under `flock /tmp/fabric-lab.lock` when several people share the machine.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import typer

from lab.cluster import LabConfig, LabIsUp, lab_state_dir
from lab.cluster import down as lab_down
from lab.cluster import status as lab_status
from lab.cluster import up as lab_up
from lab.ecmp_cli import ecmp_app, need_root

lab_app = typer.Typer(help="The lab: a whole Fabric cluster in network namespaces on this machine.",
                      no_args_is_help=True, add_completion=False)
lab_app.add_typer(ecmp_app, name="ecmp")  # two balancer nodes behind a BGP router (lab/ecmp.py)

StateOpt = typer.Option(None, "--state-dir",
                        help="where the lab keeps its state and logs (default $FABRIC_LAB_STATE, else /var/lib/fabric/lab)")


def _cfg(state_dir: Path | None) -> LabConfig:
    return LabConfig(state_dir=state_dir.resolve() if state_dir else lab_state_dir())


@lab_app.command()
def up(state_dir: Path = StateOpt,
       force: bool = typer.Option(False, "--force", help="take a lab that is up down first (its store goes too)")) -> None:
    """Clean stale pieces, then build the topology and start fabricd, the agent and the gateway.
    A lab that is up is refused (its data would go) unless --force."""
    need_root()
    from lab.run_main import lab_engine  # the engine make run picks: vllm when installed

    cfg = dataclasses.replace(_cfg(state_dir), engine=lab_engine(echo=typer.echo))
    try:
        handle = lab_up(cfg, echo=typer.echo, force=force)
    except LabIsUp as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    except RuntimeError as exc:
        typer.echo(f"error: {exc}\nlogs: {cfg.state_dir / 'logs'}; clean up with `fabric-lab down`", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"lab is up (state in {cfg.state_dir}). For fabricctl: source {handle.config.state_dir / 'env'}")
    typer.echo(cfg.console_hint())


@lab_app.command()
def down(state_dir: Path = StateOpt) -> None:
    """Stop the lab's processes and remove its namespaces, links and pinned maps; print each."""
    need_root()
    cfg = _cfg(state_dir)
    removed = lab_down(cfg)
    for item in removed:
        typer.echo(f"removed {item}")
    left = lab_status(cfg)
    if left:
        typer.echo("still present: " + ", ".join(left), err=True)
        raise typer.Exit(1)
    typer.echo("lab is down; nothing left behind" if removed else f"lab was already down (state {cfg.state_dir})")


@lab_app.command()
def status(state_dir: Path = StateOpt) -> None:
    """List what of the lab exists (namespaces, links, processes, pinned maps)."""
    cfg = _cfg(state_dir)
    left = lab_status(cfg)
    for item in left:
        typer.echo(item)
    if not left:
        typer.echo(f"lab is down (state {cfg.state_dir})")


@lab_app.command()
def demo(state_dir: Path = StateOpt) -> None:
    """Run the newcomer's demo against a lab that is up (again: it reuses what it made)."""
    from lab.demo import DemoError, run_demo

    cfg = _cfg(state_dir)
    try:
        run_demo(cfg, echo=typer.echo)
    except DemoError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None


def main() -> None:
    """`fabric-lab`: its own program, so fabricd never loads the lab (the lab imports the dataplane
    and with it numba, whose JIT needs writable executable memory that fabricd.service denies)."""
    from common.cli_guard import run_guarded

    run_guarded(lambda: lab_app(prog_name="fabric-lab"), "fabric-lab")


if __name__ == "__main__":
    main()
