"""`fabricctl ai explain placement|routing` and `fabricctl ai deployment drain`.

Explain shows the plan the controllers would apply now, with a reason for every node or
replica, as the REST API's explain routes return it.
"""

from __future__ import annotations

import typer

from fabricctl.output import col, emit_json, emit_table, session

explain_app = typer.Typer(help="Why the system decided what it did.", no_args_is_help=True)
JSON_OPT = typer.Option(False, "--json", help="print JSON for scripts")


@explain_app.command("placement")
def placement(deployment: str = typer.Argument(..., metavar="DEPLOYMENT", help="a deployment"), as_json: bool = JSON_OPT) -> None:
    """Which node the next replica of DEPLOYMENT goes to, and why each other node is rejected."""
    with session() as c:
        data = c.get(f"/api/ai/explain/placement/{deployment}")
    if as_json:
        emit_json(data)
        return
    typer.echo(data.get("message", ""))
    emit_table(data.get("nodes", []), [col("NODE", "node"), col("ELIGIBLE", "eligible"),
                                       col("CHOSEN", "chosen"), col("SCORE", "score"), col("REASON", "reason")], False)


@explain_app.command("routing")
def routing(endpoint: str = typer.Argument(..., metavar="ENDPOINT", help="an endpoint"), as_json: bool = JSON_OPT) -> None:
    """Each replica of ENDPOINT: included or excluded, why, its metrics and its Maglev weight."""
    with session() as c:
        data = c.get(f"/api/ai/explain/routing/{endpoint}")
    if as_json:
        emit_json(data)
        return
    typer.echo(f"endpoint {endpoint}  VIP {data.get('vip')}  strategy {data.get('strategy', '')}  "
               f"forwarding {data.get('forwarding', 'nat')}")
    cold = data.get("cold_start")
    if cold:  # no replica ready: where the cold start stands (what a held call waits for)
        typer.echo(f"cold start: {cold['phase']} ({cold['detail']})")
    emit_table(data.get("replicas", []), [col("REPLICA", "replica_id"), col("INCLUDED", "included"),
                                          col("WEIGHT", "weight"), col("REASON", "reason")], False)


def drain(name: str = typer.Argument(..., metavar="NAME", help="a deployment"),
          grace_secs: float = typer.Option(30.0, "--grace-seconds", "--grace-secs",
                                           help="seconds at weight 0 before deletion"),
          replica: str = typer.Option(None, "--replica", help="drain only this replica (it is replaced)"),
          as_json: bool = JSON_OPT) -> None:
    """Stop new traffic to a deployment's replicas (weight 0), then delete them after the grace."""
    with session({"grace_secs": "--grace-seconds", "replica": "--replica"}) as c:
        data = c.post(f"/api/ai/deployments/{name}/drain", {"grace_secs": grace_secs, "replica": replica})
        draining = [r for r in c.get("/api/ai/replicas", deployment=name) if r.get("draining")]
    if as_json:
        emit_json(data)
        return
    typer.echo(data.get("message") or f"draining {name}")
    for r in draining:
        left = r.get("drain_left_s")
        typer.echo(f"  {r['replica_id']}: weight 0, deleted in {left:g}s" if left is not None
                   else f"  {r['replica_id']}: draining")


def restart(name: str = typer.Argument(..., metavar="NAME", help="a deployment"), as_json: bool = JSON_OPT) -> None:
    """Unpark a deployment parked in CrashLoop (or backing off): its failure count goes to 0 and the
    reconciler creates replicas again."""
    with session() as c:
        data = c.post(f"/api/ai/deployments/{name}/restart", {})
    if as_json:
        emit_json(data)
        return
    was = data.get("previous_phase") or "unknown"
    typer.echo(f"deployment {name} restarted (was {was}, {data.get('previous_failures', 0)} failures"
               + (f"; last: {data['last_failure']}" if data.get("last_failure") else "") + ")")
