"""`fabric-lab ecmp up|down|status`: the two-balancer BGP/ECMP lab (lab/ecmp.py)."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from lab.ecmp import DSR_VIP, NAT_VIP, EcmpConfig, ecmp_state_dir, next_hops
from lab.ecmp import down as ecmp_down
from lab.ecmp import status as ecmp_status
from lab.ecmp import up as ecmp_up
from lab.topology_ecmp import EcmpTopology

ecmp_app = typer.Typer(help="Two balancer nodes announcing VIPs over BGP to a router (ECMP), in namespaces.",
                       no_args_is_help=True, add_completion=False)
StateOpt = typer.Option(None, "--state-dir", help="state and logs (default $FABRIC_LAB_STATE/ecmp, else "
                        "/var/lib/fabric/lab-ecmp)")


def _cfg(state_dir: Path | None, replicas: int = 2, hold_secs: int = 3, bfd: bool = False,
         gpu_hosts: int = 0) -> EcmpConfig:
    return EcmpConfig(state_dir=state_dir.resolve() if state_dir else ecmp_state_dir(),
                      topology=EcmpTopology(replicas_per_node=replicas, gpu_hosts=gpu_hosts), hold_secs=hold_secs,
                      bfd=bfd)


def need_root() -> None:
    """Exit 2 with a clear line unless run as root (both lab command groups)."""
    if os.geteuid() != 0:
        typer.echo("error: the lab creates network namespaces and loads BPF programs; run it as root", err=True)
        raise typer.Exit(2)


@ecmp_app.command()
def up(state_dir: Path = StateOpt,
       replicas: int = typer.Option(2, "--replicas", min=1, max=8, help="replicas per node"),
       hold_secs: int = typer.Option(3, "--hold-secs", min=3, max=65535, help="BGP hold time, both sides"),
       bfd: bool = typer.Option(False, "--bfd/--no-bfd", help="BFD on every session (100 ms x 3)"),
       gpu_hosts: int = typer.Option(0, "--gpu-hosts", min=0, max=4,
                                     help="nodes without the balancer role (no BGP, no services), their "
                                          "replicas backends reached through the router")) -> None:
    """Build the router, the client, two balancer nodes (and --gpu-hosts more) with their agents and
    replicas; push two VIPs to the balancers."""
    need_root()
    cfg = _cfg(state_dir, replicas, hold_secs, bfd, gpu_hosts)
    try:
        ecmp_up(cfg, echo=typer.echo)
    except RuntimeError as exc:
        typer.echo(f"error: {exc}\nlogs: {cfg.state_dir / 'logs'}; clean up with `fabric-lab ecmp down`", err=True)
        raise typer.Exit(1) from None
    for vip in (DSR_VIP, NAT_VIP):
        typer.echo(f"router: {vip}/32 via {', '.join(next_hops(cfg, vip))}")
    typer.echo(f"lab ecmp is up; try: ip netns exec {cfg.topology.client_ns} sh -c 'echo hi | nc -q1 {DSR_VIP} 80'")


@ecmp_app.command()
def down(state_dir: Path = StateOpt) -> None:
    """Stop every process of the lab and remove its namespaces and pinned maps; print each."""
    need_root()
    cfg = _cfg(state_dir)
    for item in ecmp_down(cfg):
        typer.echo(f"removed {item}")
    left = ecmp_status(cfg)
    if left:
        typer.echo("still present: " + ", ".join(left), err=True)
        raise typer.Exit(1)
    typer.echo("lab ecmp is down; nothing left behind")


@ecmp_app.command()
def status(state_dir: Path = StateOpt) -> None:
    """What of the lab exists, and the router's next hops for each VIP."""
    cfg = _cfg(state_dir)
    left = ecmp_status(cfg)
    for item in left:
        typer.echo(item)
    if not left:
        typer.echo("lab ecmp is down")
        return
    for vip in (DSR_VIP, NAT_VIP):
        typer.echo(f"router: {vip}/32 via {', '.join(next_hops(cfg, vip)) or 'nothing'}")
