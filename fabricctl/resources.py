"""`fabricctl ai` commands for models, profiles, deployments, endpoints and events.

Each command that sends a body passes `session(flags=...)` the map from API field to its own
flag, so a refusal names what the operator typed (`--gpu: must be at most 8, got 9`).
deploy, scale, expose and delete take `--wait [--timeout]` (fabricctl.wait)."""

from __future__ import annotations

import time

import typer

from fabricctl.output import col, emit_object, emit_table, session
from fabricctl.wait import (
    TIMEOUT_OPT,
    WAIT_OPT,
    deployment_ready,
    endpoint_ready,
    gone,
    wait_until,
)
from fabricctl.watch import follow_events, start_revision

JSON_OPT = typer.Option(False, "--json", help="print JSON for scripts")
NAME_ARG = typer.Argument(..., metavar="NAME", help="the resource's name")

model_app = typer.Typer(help="Model artifacts.", no_args_is_help=True)
profile_app = typer.Typer(help="Inference profiles (runtime and resources per replica).", no_args_is_help=True)
deployment_app = typer.Typer(help="Deployments of a model with a profile.", no_args_is_help=True)
endpoint_app = typer.Typer(help="OpenAI-compatible endpoints (a VIP in front of a deployment).",
                           no_args_is_help=True)

MODEL_COLUMNS = [col("NAME", "name"), col("SOURCE", "source"), col("PHASE", "status.phase"),
                 col("TENANT", "tenant")]
MODEL_WIDE = [col("LICENSE", "license"), col("MESSAGE", "status.message")]
PROFILE_COLUMNS = [col("NAME", "name"), col("RUNTIME", "runtime"), col("GPUS", "gpu.count"),
                   col("VRAM_GIB", "gpu.vram_gib"), col("CPU", "cpu"), col("MEMORY_GIB", "memory_gib")]
PROFILE_WIDE = [col("GPU_MODEL", "gpu.model"), col("MAX_MODEL_LEN", "max_model_len"), col("TENANT", "tenant")]
DEPLOYMENT_COLUMNS = [col("NAME", "name"), col("MODEL", "model"), col("PROFILE", "profile"),
                      col("REPLICAS", "replicas"), col("READY", "status.ready_replicas"),
                      col("PHASE", "status.phase"), col("MESSAGE", "status.message")]
DEPLOYMENT_WIDE = [col("REVISION", "revision"), col("TENANT", "tenant")]
ENDPOINT_COLUMNS = [col("NAME", "name"), col("DEPLOYMENT", "deployment"), col("ROUTING", "routing"),
                    col("VIP", "status.vip"), col("PORT", "port"), col("PHASE", "status.phase")]
ENDPOINT_WIDE = [col("MESSAGE", "status.message"), col("TENANT", "tenant")]
PROFILE_FLAGS = {"name": "NAME", "runtime": "--runtime", "gpu.count": "--gpu", "gpu.vram_gib": "--vram",
                 "gpu.model": "--gpu-model", "cpu": "--cpu", "memory_gib": "--memory",
                 "max_model_len": "--max-model-len", "tenant": "--tenant"}
EVENT_COLUMNS = [("TIME", lambda e: time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e["time"]))),
                 col("KIND", "kind"), col("NAME", "name"), col("ACTION", "action"), col("MESSAGE", "message")]


def _deleted(result: dict | None, kind: str, name: str, as_json: bool) -> None:
    if as_json:
        emit_object(result or {}, True)
    elif result and result.get("deleted"):
        typer.echo(f"{kind} {name} deleted")
    else:
        typer.echo(f"{kind} {name} is being deleted")


# -- models ---------------------------------------------------------------------------------------

@model_app.command("add")
def model_add(
    name: str = NAME_ARG,
    source: str = typer.Option(..., "--source", help="hf://ORG/NAME[@REV], file:///PATH or /PATH"),
    license: str = typer.Option(None, "--license", help="the model's license, e.g. apache-2.0"),
    description: str = typer.Option(None, "--description", help="what the model is for (shown in /v1/models)"),
    tenant: str = typer.Option(None, "--tenant", help="owning tenant"),
    digest: str = typer.Option(None, "--digest", help="expected digest (SHA-256 of the sorted manifest)"),
    require_checksum: bool = typer.Option(False, "--require-checksum", help="refuse Ready without a matching --digest"),
    signature: str = typer.Option(None, "--signature", help="HMAC-SHA256 hex of the digest (FABRIC_MODEL_SIGNING_KEY)"),
    size_bytes: int = typer.Option(None, "--size-bytes", help="declared size; refused on nodes with less free disk"),
    adapter: list[str] = typer.Option(None, "--adapter", help="a LoRA adapter NAME=SOURCE (repeatable), fetched "
                                                               "with the model; NAME is a model name for clients"),
    max_loaded_adapters: int = typer.Option(None, "--max-loaded-adapters",
                                            help="adapters loaded at once per replica (default 4)"),
    as_json: bool = JSON_OPT,
) -> None:
    """Register a model artifact."""
    adapters = []
    for item in adapter or []:
        adapter_name, sep, adapter_source = item.partition("=")
        if not sep or not adapter_name or not adapter_source:
            raise typer.BadParameter(f"{item!r}: expected NAME=SOURCE", param_hint="--adapter")
        adapters.append({"name": adapter_name, "source": adapter_source})
    body = {"name": name, "source": source, "license": license, "description": description, "tenant": tenant,
            "digest": digest, "require_checksum": require_checksum or None, "signature": signature,
            "size_bytes": size_bytes,
            "adapters": adapters or None, "max_loaded_adapters": max_loaded_adapters}
    with session({"name": "NAME", "source": "--source", "license": "--license", "description": "--description",
                  "tenant": "--tenant", "digest": "--digest", "signature": "--signature", "size_bytes": "--size-bytes",
                  "adapters": "--adapter", "max_loaded_adapters": "--max-loaded-adapters"}) as c:
        created = c.post("/api/ai/models", {k: v for k, v in body.items() if v is not None})
    emit_object(created, as_json) if as_json else typer.echo(f"model {name} added")


@model_app.command("list")
def model_list(as_json: bool = JSON_OPT) -> None:
    """List model artifacts."""
    with session() as c:
        emit_table(c.get("/api/ai/models"), MODEL_COLUMNS, as_json, wide=MODEL_WIDE)


@model_app.command("show")
def model_show(name: str = NAME_ARG, as_json: bool = JSON_OPT) -> None:
    """Show one model artifact."""
    with session() as c:
        emit_object(c.get(f"/api/ai/models/{name}"), as_json)


@model_app.command("delete")
def model_delete(name: str = NAME_ARG, as_json: bool = JSON_OPT) -> None:
    """Delete a model (refused while a deployment uses it)."""
    with session() as c:
        _deleted(c.delete(f"/api/ai/models/{name}"), "model", name, as_json)


# -- profiles -------------------------------------------------------------------------------------

@profile_app.command("add")
def profile_add(
    name: str = NAME_ARG,
    runtime: str = typer.Option("vllm", "--runtime", help="inference runtime, e.g. vllm"),
    gpu: int = typer.Option(1, "--gpu", help="whole GPUs per replica (1-8)"),
    vram: float = typer.Option(..., "--vram", help="minimum GiB per GPU"),
    cpu: int = typer.Option(..., "--cpu", help="vCPUs per replica"),
    memory: float = typer.Option(..., "--memory", help="GiB of memory per replica"),
    gpu_model: str = typer.Option(None, "--gpu-model", help="GPU model filter, e.g. H100"),
    max_model_len: int = typer.Option(None, "--max-model-len", help="the engine's context length"),
    tenant: str = typer.Option(None, "--tenant", help="owning tenant"),
    as_json: bool = JSON_OPT,
) -> None:
    """Add an inference profile."""
    body = {"name": name, "runtime": runtime, "cpu": cpu, "memory_gib": memory,
            "gpu": {"count": gpu, "vram_gib": vram, "model": gpu_model},
            "max_model_len": max_model_len, "tenant": tenant}
    with session(PROFILE_FLAGS) as c:
        created = c.post("/api/ai/profiles", {k: v for k, v in body.items() if v is not None})
    emit_object(created, as_json) if as_json else typer.echo(f"profile {name} added")


@profile_app.command("list")
def profile_list(as_json: bool = JSON_OPT) -> None:
    """List inference profiles."""
    with session() as c:
        emit_table(c.get("/api/ai/profiles"), PROFILE_COLUMNS, as_json, wide=PROFILE_WIDE)


@profile_app.command("show")
def profile_show(name: str = NAME_ARG, as_json: bool = JSON_OPT) -> None:
    """Show one inference profile."""
    with session() as c:
        emit_object(c.get(f"/api/ai/profiles/{name}"), as_json)


@profile_app.command("delete")
def profile_delete(name: str = NAME_ARG, as_json: bool = JSON_OPT) -> None:
    """Delete a profile (refused while a deployment uses it)."""
    with session() as c:
        _deleted(c.delete(f"/api/ai/profiles/{name}"), "profile", name, as_json)


# -- deployments ----------------------------------------------------------------------------------

def deploy(
    model: str = typer.Argument(..., metavar="MODEL", help="a model added with `fabricctl ai model add`"),
    profile: str = typer.Option(..., "--profile", help="an inference profile"),
    replicas: int = typer.Option(1, "--replicas", help="how many replicas (0-64)"),
    name: str = typer.Option(None, "--name", help="deployment name (default: the model's name)"),
    tenant: str = typer.Option(None, "--tenant", help="owning tenant"),
    capacity_class: str = typer.Option(None, "--capacity-class",
                                       help="critical | standard | opportunistic (default standard): who may "
                                            "preempt whom when GPUs run out"),
    wait: bool = WAIT_OPT,
    timeout: float = TIMEOUT_OPT,
    as_json: bool = JSON_OPT,
) -> None:
    """Deploy MODEL with a profile."""
    body = {"name": name or model, "model": model, "profile": profile, "replicas": replicas, "tenant": tenant,
            "capacity_class": capacity_class}
    with session({"name": "--name", "model": "MODEL", "profile": "--profile", "replicas": "--replicas",
                  "tenant": "--tenant", "capacity_class": "--capacity-class"}) as c:
        created = c.post("/api/ai/deployments", {k: v for k, v in body.items() if v is not None})
        if not as_json:  # said at once: a --wait that times out still leaves the deployment made
            typer.echo(f"deployment {created['name']} created ({replicas} replicas of {model} with {profile})")
        if wait:
            created = wait_until(c, "deployments", created["name"], deployment_ready, timeout) or created
            if not as_json:
                typer.echo(f"deployment {created['name']} ready: {deployment_ready(created)[1]}")
    if as_json:
        emit_object(created, True)


@deployment_app.command("list")
def deployment_list(as_json: bool = JSON_OPT) -> None:
    """List deployments with ready replicas and phase."""
    with session() as c:
        emit_table(c.get("/api/ai/deployments"), DEPLOYMENT_COLUMNS, as_json, wide=DEPLOYMENT_WIDE)


@deployment_app.command("show")
def deployment_show(name: str = NAME_ARG, as_json: bool = JSON_OPT) -> None:
    """Show one deployment with its status."""
    with session() as c:
        emit_object(c.get(f"/api/ai/deployments/{name}"), as_json)


@deployment_app.command("scale")
def deployment_scale(name: str = NAME_ARG,
                     replicas: int = typer.Option(..., "--replicas", help="the new replica count (0-64)"),
                     wait: bool = WAIT_OPT, timeout: float = TIMEOUT_OPT, as_json: bool = JSON_OPT) -> None:
    """Set a deployment's replica count."""
    with session({"replicas": "--replicas"}) as c:
        updated = c.post(f"/api/ai/deployments/{name}/scale", {"replicas": replicas})
        if wait:
            updated = wait_until(c, "deployments", name, deployment_ready, timeout) or updated
    emit_object(updated, as_json) if as_json else typer.echo(f"deployment {name} scaled to {replicas} replicas")


@deployment_app.command("delete")
def deployment_delete(name: str = NAME_ARG, wait: bool = WAIT_OPT, timeout: float = TIMEOUT_OPT,
                      as_json: bool = JSON_OPT) -> None:
    """Delete a deployment and its replicas (refused while an endpoint exposes it)."""
    with session() as c:
        result = c.delete(f"/api/ai/deployments/{name}")
        if wait:
            wait_until(c, "deployments", name, gone, timeout)
            result = {"kind": "deployment", "name": name, "deleted": True}
        _deleted(result, "deployment", name, as_json)


# -- endpoints ------------------------------------------------------------------------------------

@endpoint_app.command("expose")
def endpoint_expose(
    deployment: str = typer.Argument(..., metavar="DEPLOYMENT", help="the deployment to put behind a VIP"),
    openai_compatible: bool = typer.Option(True, "--openai-compatible", help="serve the OpenAI API (the only kind)"),
    routing: str = typer.Option("equal", "--routing", help="equal, least_queue, lowest_ttft, ..."),
    name: str = typer.Option(None, "--name", help="endpoint name (default: DEPLOYMENT-openai)"),
    port: int = typer.Option(None, "--port", help="VIP port (default 8000)"),
    forwarding: str = typer.Option("nat", "--forwarding", help="nat (default) or dsr-ipip: replies go from the "
                                                             "replicas straight to the client (port 8000 only)"),
    spill_to: list[str] = typer.Option(None, "--spill-to", help="a deployment used when the ones before are "
                                                              "saturated (repeat, in preference order)"),
    fallback: list[str] = typer.Option(None, "--fallback", help="an external endpoint used when the cluster has "
                                                              "no capacity left (repeat)"),
    wait: bool = WAIT_OPT,
    timeout: float = TIMEOUT_OPT,
    as_json: bool = JSON_OPT,
) -> None:
    """Expose a deployment behind a VIP."""
    body = {"name": name or f"{deployment}-openai", "deployment": deployment,
            "openai_compatible": openai_compatible, "routing": routing, "port": port,
            "forwarding": forwarding, "spillover": spill_to or None, "fallbacks": fallback or None}
    with session({"name": "--name", "deployment": "DEPLOYMENT", "routing": "--routing", "port": "--port",
                  "forwarding": "--forwarding", "spillover": "--spill-to", "fallbacks": "--fallback"}) as c:
        created = c.post("/api/ai/endpoints", {k: v for k, v in body.items() if v is not None})
        if not as_json:
            typer.echo(f"endpoint {created['name']} created for deployment {deployment} "
                       f"(routing {routing}, forwarding {forwarding})"
                       + ("" if wait else f"; its VIP is assigned shortly: fabricctl ai endpoint show {created['name']}"))
        if wait:
            created = wait_until(c, "endpoints", created["name"], endpoint_ready, timeout) or created
            if not as_json:
                vip = (created.get("status") or {}).get("vip")
                typer.echo(f"endpoint {created['name']} serves on VIP {vip}:{created.get('port', 8000)}")
    if as_json:
        emit_object(created, True)


@endpoint_app.command("list")
def endpoint_list(as_json: bool = JSON_OPT) -> None:
    """List endpoints with their VIPs."""
    with session() as c:
        emit_table(c.get("/api/ai/endpoints"), ENDPOINT_COLUMNS, as_json, wide=ENDPOINT_WIDE)


@endpoint_app.command("show")
def endpoint_show(name: str = NAME_ARG, as_json: bool = JSON_OPT) -> None:
    """Show one endpoint."""
    with session() as c:
        emit_object(c.get(f"/api/ai/endpoints/{name}"), as_json)


@endpoint_app.command("delete")
def endpoint_delete(name: str = NAME_ARG, wait: bool = WAIT_OPT, timeout: float = TIMEOUT_OPT,
                    as_json: bool = JSON_OPT) -> None:
    """Delete an endpoint (its VIP is released)."""
    with session() as c:
        result = c.delete(f"/api/ai/endpoints/{name}")
        if wait:
            wait_until(c, "endpoints", name, gone, timeout)
        _deleted(result, "endpoint", name, as_json)


# -- events ---------------------------------------------------------------------------------------

def events(
    limit: int = typer.Option(50, "--limit", help="at most this many (1-1000)"),
    kind: str = typer.Option(None, "--kind", help="model, profile, deployment, endpoint, node, key, ..."),
    name: str = typer.Option(None, "--name", help="only events of the resource with this name"),
    obj: str = typer.Option(None, "--object", help="only events of this object: NAME or KIND/NAME"),
    since: str = typer.Option(None, "--since", help="only events after this: unix seconds or an age (90s, 10m, 2h)"),
    watch: bool = typer.Option(False, "--watch", "-w", help="then keep printing new events as they happen"),
    as_json: bool = JSON_OPT,
) -> None:
    """Recent events: every create, delete and scale, and what controllers did."""
    with session({"kind": "--kind", "limit": "--limit", "name": "--name", "object": "--object",
                  "since": "--since"}) as c:
        revision = start_revision(c, "events") if watch else 0
        rows = c.get("/api/ai/events", limit=limit, kind=kind, name=name, object=obj, since=since)
        emit_table(rows, EVENT_COLUMNS, as_json)
        if watch:
            follow_events(c, kind, name, EVENT_COLUMNS, revision)
