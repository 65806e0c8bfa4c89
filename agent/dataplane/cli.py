"""`fabric-agent maglev ...`: operator debugging on the live pinned maps.

Every command opens the same pinned maps the agent uses (pin_dir), so what it
shows and changes is what the XDP program is forwarding with right now. show,
set and delete open existing pins without compiling the BPF program (their
types come from the kernel's BTF, pinned.py): milliseconds, not a clang run;
attach compiles (it loads the programs), and so does a set that creates the maps.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager

import typer

from agent.dataplane.addresses import parse_service_spec
from common.errors import FabricError

maglev_app = typer.Typer(no_args_is_help=True, add_completion=False,
                         help="Inspect and change the XDP Maglev dataplane's live maps")

PinDir = typer.Option("/sys/fs/bpf/fabric", "--pin-dir", envvar="FABRIC_PIN_DIR", help="bpffs directory of the maps")
NodeIp = typer.Option(None, "--node-ip", envvar="FABRIC_NODE_IP", help="source address for routed backends")
BackendOpt = typer.Option(..., "--backend", help="IP:PORT=WEIGHT (0-32), repeat")
DrainingOpt = typer.Option(None, "--draining", help="IP:PORT taking no new flows")
TableSize = typer.Option(None, "--table-size",
                         help="Maglev table size (prime) for new maps; existing maps keep theirs (default 65537)")
FlowEntries = typer.Option(None, "--flow-entries", envvar="FABRIC_FLOW_ENTRIES",
                           help="flows each CPU's list of the flow tables holds, for new maps; existing maps keep "
                                "theirs (default 1048576 up to 2 CPUs, 2Mi / CPUs beyond)")


def _open(pin_dir: str, node_ip: str | None, table_size: int | None, flow_entries: int | None = None,
          programs: bool = False):
    """programs=False for the map commands: existing pins open without a BPF compile (pinned.py)."""
    from agent.dataplane.dataplane import Dataplane
    from agent.settings import DataplaneSettings

    settings = DataplaneSettings.from_env(os.environ)  # this CLI's own process: read once, here
    return Dataplane(pin_dir=pin_dir, node_ip=node_ip, table_size=table_size, flow_entries=flow_entries,
                     settings=settings, programs=programs)


def _fail(exc: FabricError) -> None:
    typer.echo(f"error: {exc.message}", err=True)
    raise typer.Exit(code=2)


@contextmanager
def _maps(pin_dir: str, node_ip: str | None, table_size: int | None, flow_entries: int | None = None,
          programs: bool = False) -> Iterator:
    """The opened dataplane, closed afterwards; a FabricError on the way becomes exit code 2."""
    try:
        dp = _open(pin_dir, node_ip, table_size, flow_entries, programs)
        try:
            yield dp
        finally:
            dp.close()
    except FabricError as exc:
        _fail(exc)


def _service(spec: str):
    try:
        return parse_service_spec(spec)
    except FabricError as exc:
        _fail(exc)


@maglev_app.command()
def show(pin_dir: str = PinDir, as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """Services, backends, weights, slot shares, active flows, packet and verdict counters."""
    with _maps(pin_dir, None, None) as dp:
        services = dp.list_services()
        verdicts = dp.verdict_counters()
    if as_json:
        typer.echo(json.dumps({"services": [s.model_dump() for s in services], "verdicts": verdicts}, indent=2))
        return
    for svc in services:
        state = " (no backends: new flows dropped)" if svc.no_backends else ""
        typer.echo(f"{svc.vip}:{svc.port}/{svc.proto} ring {svc.active_ring}{state}"
                   f"  misses syn {svc.misses.syn} other {svc.misses.other}")
        for b in svc.backends:
            flags = ",".join(f for f, on in (("draining", b.draining), ("snat", b.source_nat)) if on)
            typer.echo(f"  {b.address:<22} weight {b.weight:>2}  slots {b.slots:>6} ({b.share:6.2%})"
                       f"  active {b.active_flows:>7}  packets {b.packets:>10}  bytes {b.bytes:>12}  {flags}")
    typer.echo("verdicts: " + " ".join(f"{k}={v}" for k, v in verdicts.items() if v))


def _parse_backends(specs: list[str]) -> dict[str, int]:
    out = {}
    for spec in specs:
        addr, sep, weight = spec.rpartition("=")
        if not sep or not weight.isdigit():
            raise typer.BadParameter(f"backend must look like IP:PORT=WEIGHT, got {spec!r}")
        out[addr] = int(weight)
    return out


@maglev_app.command("set")
def set_service(
    service: str = typer.Argument(..., help="VIP:PORT/PROTO"),
    backend: list[str] = BackendOpt,
    draining: list[str] | None = DrainingOpt,
    pin_dir: str = PinDir, table_size: int | None = TableSize, flow_entries: int | None = FlowEntries,
) -> None:
    """Create or replace a service's backends (source NAT follows the node_ip attach wrote)."""
    backends = _parse_backends(backend)
    addr = _service(service)
    with _maps(pin_dir, None, table_size, flow_entries) as dp:
        changed = dp.put_service(addr.vip, addr.port, addr.proto, backends, draining or [])
    typer.echo(f"{addr}: {'updated' if changed else 'unchanged'}")


@maglev_app.command()
def delete(service: str = typer.Argument(..., help="VIP:PORT/PROTO"), pin_dir: str = PinDir) -> None:
    """Remove a service (established flows to it stop being forwarded)."""
    addr = _service(service)
    with _maps(pin_dir, None, None) as dp:
        found = dp.delete_service(addr.vip, addr.port, addr.proto)
    if not found:
        typer.echo(f"{addr}: not found", err=True)
        raise typer.Exit(code=1)
    typer.echo(f"{addr}: deleted")


@maglev_app.command()
def attach(iface: str = typer.Option(..., "--iface"), netns: str | None = typer.Option(None, "--netns"),
           pin_dir: str = PinDir, node_ip: str | None = NodeIp, table_size: int | None = TableSize,
           flow_entries: int | None = FlowEntries) -> None:
    """Attach XDP (ingress) and the TC reverse-NAT program (egress) to IFACE; writes node_ip
    and the flow settings (FABRIC_UDP_FLOW_SECS, FABRIC_MISS_INSERTS)."""
    with _maps(pin_dir, node_ip, table_size, flow_entries, programs=True) as dp:
        dp.attach(iface, netns)
        memory = dp.flow_table_bytes()
        entries = dp.flow_entries
    typer.echo(f"attached to {iface}" + (f" in {netns}" if netns else "")
               + f"; flow tables {entries} entries x 2 (forward, reverse): {memory / 2**20:.1f} MiB of kernel memory")


@maglev_app.command()
def detach(iface: str = typer.Option(..., "--iface"), netns: str | None = typer.Option(None, "--netns"),
           pin_dir: str = PinDir) -> None:
    """Detach both programs from IFACE; pins of an older layout under PIN_DIR are removed."""
    from agent.dataplane.attach import detach_programs
    from agent.dataplane.pins import remove_stale_pins, writer_lock

    try:
        detach_programs(iface, netns)
        removed = []
        if os.path.isdir(pin_dir):
            with writer_lock(pin_dir):
                removed = remove_stale_pins(pin_dir)
    except FabricError as exc:
        _fail(exc)
    typer.echo(f"detached from {iface}" + (f" in {netns}" if netns else "")
               + (f"; removed stale pins: {', '.join(removed)}" if removed else ""))
