"""`fabricctl ai replica list|show` and `fabricctl ai logs REPLICA [-f]`.

    replica list [--deployment D]   every replica with node, address, phase and, while draining,
                                    the grace left before it is deleted
    replica show REPLICA            one replica
    logs REPLICA [-f] [--tail N]    the engine's log from the agent of the replica's node (the lab
                                    replica's output; a VM's serial console); -f keeps following
"""

from __future__ import annotations

import time

import typer

from fabricctl.output import col, emit_object, emit_table, session

JSON_OPT = typer.Option(False, "--json", help="print JSON for scripts")
REPLICA_ARG = typer.Argument(..., metavar="REPLICA", help="a replica id from `fabricctl ai replica list`")
FOLLOW_EVERY_S = 1.0


def drain_left(r: dict) -> str:
    left = r.get("drain_left_s")
    return f"{left:g}s" if left is not None else "-"


COLUMNS = [col("REPLICA", "replica_id"), col("DEPLOYMENT", "deployment"), col("REV", "revision"),
           col("NODE", "node"), col("PHASE", "phase"), ("READY", lambda r: "yes" if r.get("ready") else "no"),
           ("DRAIN_LEFT", drain_left), col("MESSAGE", "message")]
WIDE = [col("HOST", "host"), col("PORT", "port"), col("GPUS", "gpus"), col("VM", "vm_id")]

replica_app = typer.Typer(help="Replicas of deployments: where each runs and how it is doing.",
                          no_args_is_help=True)


@replica_app.command("list")
def replica_list(deployment: str = typer.Option(None, "--deployment", "-d", help="only this deployment's"),
                 as_json: bool = JSON_OPT) -> None:
    """List replicas, with the drain grace left for draining ones."""
    with session() as c:
        emit_table(c.get("/api/ai/replicas", deployment=deployment), COLUMNS, as_json, wide=WIDE)


@replica_app.command("show")
def replica_show(replica: str = REPLICA_ARG, as_json: bool = JSON_OPT) -> None:
    """Show one replica."""
    with session() as c:
        emit_object(c.get(f"/api/ai/replicas/{replica}"), as_json)


def logs(
    replica: str = REPLICA_ARG,
    follow: bool = typer.Option(False, "--follow", "-f", help="keep printing new output (Ctrl-C stops)"),
    tail: int = typer.Option(16384, "--tail", min=1, help="start this many bytes before the end"),
) -> None:
    """Print a replica's engine log (lab: the engine's output; VM: its serial console)."""
    with session() as c:
        chunk = c.get(f"/api/ai/replicas/{replica}/logs", offset=-tail)
        typer.echo(chunk["text"], nl=False)
        offset = chunk["next_offset"]
        try:
            while follow:
                chunk = c.get(f"/api/ai/replicas/{replica}/logs", offset=offset)
                if chunk["text"]:
                    typer.echo(chunk["text"], nl=False)
                elif chunk["size"] < offset:  # the log was replaced (a restarted engine): start over
                    offset = 0
                    continue
                offset = chunk["next_offset"]
                if not chunk["text"]:
                    time.sleep(FOLLOW_EVERY_S)
        except KeyboardInterrupt:
            raise typer.Exit(0) from None


def register(ai: typer.Typer) -> None:
    ai.add_typer(replica_app, name="replica")
    ai.command("logs")(logs)
