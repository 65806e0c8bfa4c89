"""`fabricctl ai deployment autoscale` and `fabricctl ai quota set|list`.

autoscale reads the deployment's current autoscaling spec and changes only the flags given, so
`--disable` alone keeps the thresholds for a later `--enable`.
"""

from __future__ import annotations

import typer

from fabricctl.output import col, emit_json, emit_object, emit_table, session

JSON_OPT = typer.Option(False, "--json", help="print JSON for scripts")
quota_app = typer.Typer(help="Tenant quotas: GPUs, CPU cores, memory, and the guaranteed GPU share.",
                        no_args_is_help=True)
QUOTA_COLUMNS = [col("TENANT", "tenant"), col("MAX_GPUS", "max_gpus"), col("USED_GPUS", "used_gpus"),
                 col("MAX_CPU", "max_cpu"), col("USED_CPU", "used_cpu"), col("MAX_MEM_GIB", "max_memory_gib"),
                 col("USED_MEM_GIB", "used_memory_gib"), col("GUARANTEED_GPUS", "guaranteed_gpus")]


def autoscale(
    name: str = typer.Argument(..., metavar="NAME", help="the deployment's name"),
    enable: bool = typer.Option(None, "--enable/--disable", help="turn the autoscaler on or off"),
    min_replicas: int = typer.Option(None, "--min", help="fewest replicas while serving"),
    max_replicas: int = typer.Option(None, "--max", help="most replicas"),
    scale_out_queue: float = typer.Option(None, "--scale-out-queue", help="mean waiting requests per replica"),
    scale_out_seconds: float = typer.Option(None, "--scale-out-seconds", help="how long the queue must stay above"),
    scale_out_ttft_ms: float = typer.Option(None, "--scale-out-ttft-ms", help="mean time to first token, ms"),
    scale_in_queue: float = typer.Option(None, "--scale-in-queue", help="queue under which to scale in"),
    scale_in_seconds: float = typer.Option(None, "--scale-in-seconds", help="how long the queue must stay below"),
    scale_to_zero: bool = typer.Option(None, "--scale-to-zero/--no-scale-to-zero",
                                       help="park at 0 replicas when idle; the next gateway call starts one"),
    scale_to_zero_idle_seconds: float = typer.Option(None, "--scale-to-zero-idle-seconds",
                                                     help="to 0 only after nothing ran or finished for this long"),
    cooldown_seconds: float = typer.Option(None, "--cooldown-seconds", help="no change against the last within"),
    as_json: bool = JSON_OPT,
) -> None:
    """Set DEPLOYMENT's autoscaling (only the flags given change)."""
    given = {"enabled": enable, "min_replicas": min_replicas, "max_replicas": max_replicas,
             "scale_out_queue": scale_out_queue, "scale_out_seconds": scale_out_seconds,
             "scale_out_ttft_ms": scale_out_ttft_ms, "scale_in_queue": scale_in_queue,
             "scale_in_seconds": scale_in_seconds, "scale_to_zero": scale_to_zero,
             "scale_to_zero_idle_seconds": scale_to_zero_idle_seconds, "cooldown_seconds": cooldown_seconds}
    with session() as c:
        current = c.get(f"/api/ai/deployments/{name}").get("autoscaling") or {}
        spec = {**current, **{k: v for k, v in given.items() if v is not None}}
        record = c.put(f"/api/ai/deployments/{name}/autoscaling", spec)
    if as_json:
        emit_json(record)
        return
    emit_object({"deployment": name, **record.get("autoscaling", {})}, False)


@quota_app.command("set")
def quota_set(
    tenant: str = typer.Argument(..., metavar="TENANT", help="the tenant"),
    max_gpus: int = typer.Option(None, "--max-gpus", help="whole GPUs the tenant may hold (unset: no limit)"),
    max_cpu: int = typer.Option(None, "--max-cpu", help="CPU cores the tenant may hold (unset: no limit)"),
    max_memory_gib: float = typer.Option(None, "--max-memory-gib", help="GiB of memory (unset: no limit)"),
    guaranteed_gpus: int = typer.Option(None, "--guaranteed-gpus", help="GPUs preemption never takes from it"),
    as_json: bool = JSON_OPT,
) -> None:
    """Set (replace) TENANT's quota: replicas x their profile's GPUs, CPU and memory over its deployments."""
    body = {"tenant": tenant, "max_gpus": max_gpus, "max_cpu": max_cpu, "max_memory_gib": max_memory_gib,
            "guaranteed_gpus": guaranteed_gpus}
    with session({"max_gpus": "--max-gpus", "max_cpu": "--max-cpu", "max_memory_gib": "--max-memory-gib",
                  "guaranteed_gpus": "--guaranteed-gpus"}) as c:
        emit_object(c.post("/api/ai/quotas", {k: v for k, v in body.items() if v is not None}), as_json)


@quota_app.command("list")
def quota_list(as_json: bool = JSON_OPT) -> None:
    """Every tenant quota with its use."""
    with session() as c:
        emit_table(c.get("/api/ai/quotas"), QUOTA_COLUMNS, as_json)
