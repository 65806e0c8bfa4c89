"""`fabricctl ai node ...` and `fabricctl ai gpus`.

    node add NAME [--out DIR] [--host H ...] [--site S] [--replica-network CIDR ...] [--balancer|--no-balancer]
                                               issue NAME's certificate from the cluster CA and write
                                                DIR/NAME.crt, DIR/NAME.key (0600) and DIR/ca.crt: copy
                                                DIR to the node and start `fabric-agent serve --pki-dir DIR`
    node join-token [--node-id N] [--host H] [--site S] [--replica-network CIDR ...] [--balancer|--no-balancer]
                                               a one-time token `fabric-agent join` trades for its
                                               certificate; without --node-id it only creates a new node;
                                               the node registers in the site, networks and role named here
    node role NAME --balancer|--no-balancer    give NAME the balancer role (it carries the VIPs' Maglev
                                               services and announces them) or take it away
    node delete NAME                           remove NAME and revoke its certificates (drain it first)
    node list | node show NAME                 nodes with online/offline and why
    node drain NAME [--grace-seconds S] [--reason R]
                                               close NAME to new replicas and drain its replicas (each is
                                               replaced elsewhere); node uncordon NAME reopens it
    gpus                                       every GPU with its node and the replica holding it
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from common.private_fs import private_dir, write_private
from fabricctl.output import col, emit_json, emit_object, emit_table, session

JSON_OPT = typer.Option(False, "--json", help="print JSON for scripts")
# Where a new node registers: `node add` and `node join-token` take the same options.
SiteOpt = Annotated[str | None, typer.Option("--site", help="the site the node registers in")]
NetworksOpt = Annotated[list[str] | None, typer.Option(
    "--replica-network", help="a CIDR its replicas' addresses must lie in (repeatable)")]
BalancerOpt = Annotated[bool | None, typer.Option(
    "--balancer/--no-balancer",
    help="the node carries the VIPs' Maglev services and announces them over BGP (a balancer); "
         "default: a balancer only while no node is one (a single host, a fleet's first node)")]

node_app = typer.Typer(help="GPU hosts running fabric-agent.", no_args_is_help=True)

NODE_COLUMNS = [col("NAME", "id"), col("PHASE", "phase"), col("SITE", "site"),
                col("DOMAIN", "failure_domain"), ("ROLE", lambda n: "balancer" if n.get("balancer") else "-"),
                ("GPUS", lambda n: len(n.get("gpus") or [])),
                col("CPU_FREE", "cpu_free"), col("MEM_FREE_GIB", "memory_free_gib"),
                col("DRIVER", "vm_driver"), col("TAINTS", "taints"), col("MESSAGE", "message")]
GPU_COLUMNS = [col("NODE", "node"), col("PCI", "pci"), col("NAME", "name"),
               ("MEM_GIB", lambda g: round(g.get("memory_total_mib", 0) / 1024, 1)),
               col("TEMP_C", "temperature_c"), col("POWER_W", "power_w"), col("ECC", "ecc_uncorrected"),
               ("ALLOCATED_TO", lambda g: g.get("allocated_to") or "-"),
               ("NODE_ONLINE", lambda g: "yes" if g.get("node_online") else "no")]

# `node show`'s GPU table: the node is the one shown, the rest as `gpus` lists them.
NODE_GPU_COLUMNS = [col("INDEX", "index"), col("PCI", "pci"), col("NAME", "name"),
                    ("MEM_GIB", lambda g: round(g.get("memory_total_mib", 0) / 1024, 1)),
                    ("USED_GIB", lambda g: round(g.get("memory_used_mib", 0) / 1024, 1)),
                    col("TEMP_C", "temperature_c"), col("POWER_W", "power_w"), col("ECC", "ecc_uncorrected"),
                    col("STATE", "state"), ("MIG", lambda g: g.get("mig_profile") or ("on" if g.get("mig_mode") else "-")),
                    col("DRIVER", "driver")]


def write_node_files(out: Path, issued: dict) -> tuple[Path, Path, Path]:
    """Write NAME.crt, NAME.key (0600 from creation) and ca.crt under out."""
    private_dir(out)  # the node's key: 0600 in a 0700 directory
    name = issued["node_id"]
    crt, key, ca = out / f"{name}.crt", out / f"{name}.key", out / "ca.crt"
    write_private(key, issued["key_pem"])
    crt.write_text(issued["cert_pem"])
    ca.write_text(issued["ca_pem"])
    return crt, key, ca


def _registration(host: list[str] | None, site: str | None, network: list[str] | None,
                  balancer: bool | None) -> dict:
    """What the new node's certificate names and where it registers (SiteOpt, NetworksOpt, BalancerOpt)."""
    return {"hosts": host or [], "site": site, "replica_networks": network or [], "balancer": balancer}


@node_app.command("add")
def node_add(
    name: str = typer.Argument(..., metavar="NAME", help="the new node's id (its certificate's CN)"),
    out: Annotated[Path | None, typer.Option(
        "--out", help="directory for NAME.crt, NAME.key, ca.crt (default ./NAME-pki)")] = None,
    host: Annotated[list[str] | None, typer.Option(
        "--host", help="extra host name or IP the agent serves under")] = None,
    site: SiteOpt = None,
    network: NetworksOpt = None,
    balancer: BalancerOpt = None,
    as_json: bool = JSON_OPT,
) -> None:
    """Issue a node certificate from the cluster CA (the node registers itself when its agent starts)."""
    out = out or Path(f"{name}-pki")
    with session() as c:
        issued = c.post(f"/api/ai/nodes/{name}/certificate", _registration(host, site, network, balancer))
    crt, key, ca = write_node_files(out, issued)
    if as_json:
        emit_object({"node_id": name, "cert": str(crt), "key": str(key), "ca": str(ca)}, True)
        return
    typer.echo(f"node {name}: certificate {crt}, key {key}, CA {ca}")
    typer.echo(f"on the node: fabric-agent serve --node-id {name} --pki-dir DIR --control-plane URL")


@node_app.command("join-token")
def node_join_token(
    node_id: Annotated[str | None, typer.Option("--node-id", help="bind the token to this node id")] = None,
    host: Annotated[list[str] | None, typer.Option(
        "--host", help="extra host name or IP the node's certificate names (repeatable)")] = None,
    ttl: int = typer.Option(900, "--ttl", help="seconds the token is valid (60-86400)"),
    site: SiteOpt = None,
    network: NetworksOpt = None,
    balancer: BalancerOpt = None,
    as_json: bool = JSON_OPT,
) -> None:
    """A one-time, short-lived token a new node trades for its certificate (fabric-agent join)."""
    with session() as c:
        made = c.post("/api/ai/join-tokens", {"node_id": node_id, "ttl_s": ttl,
                                              **_registration(host, site, network, balancer)})
    if as_json:
        emit_object(made, True)
        return
    typer.echo(made["token"])
    typer.echo(f"valid once, for {ttl}s; on the node: {made['command']}", err=True)


@node_app.command("role")
def node_role(name: str = typer.Argument(..., metavar="NAME", help="the node's id"),
              balancer: bool = typer.Option(..., "--balancer/--no-balancer",
                                            help="give the balancer role, or take it away"),
              as_json: bool = JSON_OPT) -> None:
    """Make a node a balancer (it carries every VIP's Maglev service and announces the VIPs) or not;
    the routing controller moves the services on its next pass."""
    with session() as c:
        data = c.put(f"/api/ai/nodes/{name}/role", {"balancer": balancer})
    if as_json:
        emit_json(data)
        return
    typer.echo(f"node {name} {'is a balancer' if data['balancer'] else 'is not a balancer'}; the routing "
               "controller moves the VIP services on its next pass")


@node_app.command("delete")
def node_delete(name: str = typer.Argument(..., metavar="NAME", help="the node's id")) -> None:
    """Remove a node and revoke its certificates (it can no longer heartbeat or renew)."""
    with session() as c:
        c.delete(f"/api/ai/nodes/{name}")
    typer.echo(f"node {name} deleted; its certificates are revoked")


@node_app.command("list")
def node_list(as_json: bool = JSON_OPT) -> None:
    """List nodes, online or offline and why."""
    with session() as c:
        emit_table(c.get("/api/ai/nodes"), NODE_COLUMNS, as_json)


@node_app.command("drain")
def node_drain(name: str = typer.Argument(..., metavar="NAME", help="the node's id"),
               grace_secs: float = typer.Option(30.0, "--grace-seconds", "--grace-secs",
                                                help="seconds each replica may finish at weight 0 before deletion"),
               reason: str = typer.Option("drained by an admin", "--reason", help="why; shown on the node"),
               as_json: bool = JSON_OPT) -> None:
    """Close a node to new replicas and drain every replica on it (each is replaced on another node)."""
    with session({"grace_secs": "--grace-seconds", "reason": "--reason"}) as c:
        data = c.post(f"/api/ai/nodes/{name}/drain", {"grace_secs": grace_secs, "reason": reason})
    if as_json:
        emit_json(data)
        return
    typer.echo(f"node {data['node']} cordoned ({data['cordoned']}); {len(data['drained'])} replicas draining, "
               f"{grace_secs:g}s grace")
    for rid in data["drained"]:
        typer.echo(f"  {rid}: weight 0, replaced elsewhere")


@node_app.command("uncordon")
def node_uncordon(name: str = typer.Argument(..., metavar="NAME", help="the node's id"),
                  as_json: bool = JSON_OPT) -> None:
    """Let a cordoned node take new replicas again."""
    with session() as c:
        emit_object(c.post(f"/api/ai/nodes/{name}/uncordon", {}), as_json)


@node_app.command("show")
def node_show(name: str = typer.Argument(..., metavar="NAME", help="the node's id"), as_json: bool = JSON_OPT) -> None:
    """Show one node with its GPUs and heartbeat."""
    with session() as c:
        emit_object(c.get(f"/api/ai/nodes/{name}"), as_json, tables={"gpus": NODE_GPU_COLUMNS})


def gpus(as_json: bool = JSON_OPT) -> None:
    """GPUs on every node with the replica holding each."""
    with session() as c:
        emit_table(c.get("/api/ai/gpus"), GPU_COLUMNS, as_json)
