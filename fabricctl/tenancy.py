"""`fabricctl ai user|policy|key-policy ...` and `fabricctl ai admit` (docs/tenancy.md).

A new user's password comes from --password-file, FABRIC_NEW_PASSWORD or a prompt (asked
twice), never the command line, so it stays out of shell history and `ps`.
"""

from __future__ import annotations

from pathlib import Path

import typer
import yaml

from fabricctl.output import col, emit_json, emit_object, emit_table, fail, session
from fabricctl.settings import current

user_app = typer.Typer(help="Local control-plane users: role and tenant.", no_args_is_help=True)
policy_app = typer.Typer(help="Tenant deploy policies: allowed models, sources and UTC hours.", no_args_is_help=True)
key_policy_app = typer.Typer(help="Per-endpoint API key policies (checked at key create and rotate).",
                             no_args_is_help=True)
JSON_OPT = typer.Option(False, "--json", help="print JSON for scripts")
USER_COLUMNS = [col("NAME", "name"), col("ROLE", "role"), col("TENANT", "tenant")]
POLICY_COLUMNS = [col("TENANT", "tenant"), col("MODELS", "allowed_models"),
                  col("SOURCES", "allowed_source_prefixes"), col("FROM", "deploy_hour_start"),
                  col("TO", "deploy_hour_end")]


def _new_password(password_file: Path | None) -> str:
    if password_file is not None:
        try:
            return password_file.read_text().strip()
        except OSError as exc:
            fail(f"--password-file {password_file}: {exc.strerror}", 2)
    new_password = current().new_password
    if new_password:
        return new_password
    return typer.prompt("new password", hide_input=True, confirmation_prompt=True)


@user_app.command("add")
def user_add(
    name: str = typer.Argument(..., metavar="NAME", help="a DNS label (not admin or viewer)"),
    role: str = typer.Option(..., "--role", help="admin, operator or viewer"),
    tenant: str = typer.Option(None, "--tenant", help="bind the user to this tenant (none: cluster-wide)"),
    password_file: Path = typer.Option(None, "--password-file", help="read the password from this file"),
    as_json: bool = JSON_OPT,
) -> None:
    """Add a local user; it logs in with `fabricctl ai login --username NAME`."""
    body = {"name": name, "role": role, "tenant": tenant, "password": _new_password(password_file)}
    with session() as c:
        emit_object(c.post("/api/ai/users", body), as_json)


@user_app.command("list")
def user_list(as_json: bool = JSON_OPT) -> None:
    """Every local user (never a password or its hash)."""
    with session() as c:
        emit_table(c.get("/api/ai/users"), USER_COLUMNS, as_json)


@user_app.command("delete")
def user_delete(name: str = typer.Argument(..., metavar="NAME", help="the user to delete"), as_json: bool = JSON_OPT) -> None:
    """Delete a local user (tokens it holds work until they expire)."""
    with session() as c:
        result = c.delete(f"/api/ai/users/{name}")
    if as_json:
        emit_object(result, True)
    else:
        typer.echo(f"user {name} deleted")


def _hours(window: str | None) -> tuple[int | None, int | None]:
    if window is None:
        return None, None
    start, sep, end = window.partition("-")
    if not sep or not start.strip().isdigit() or not end.strip().isdigit():
        fail(f"--hours {window!r}: expected START-END in UTC hours, e.g. 22-6", 2)
    return int(start), int(end)


@policy_app.command("set")
def policy_set(
    tenant: str = typer.Argument(..., metavar="TENANT", help="the tenant the policy is for"),
    model: list[str] = typer.Option(None, "--model", help="repeatable: a model name the tenant may deploy"),
    source_prefix: list[str] = typer.Option(None, "--source-prefix", help="repeatable: e.g. hf://my-org/"),
    hours: str = typer.Option(None, "--hours", help="UTC START-END (end excluded; 22-6 wraps midnight)"),
    capacity_class: list[str] = typer.Option(None, "--capacity-class", help="repeatable: critical, standard or "
                                             "opportunistic (none given: standard and opportunistic)"),
    preempt_other_tenants: bool = typer.Option(False, "--preempt-other-tenants",
                                               help="its replicas may preempt other tenants' lower-class ones"),
    as_json: bool = JSON_OPT,
) -> None:
    """Set TENANT's deploy policy (replaces its previous one; no option: allow everything but critical)."""
    start, end = _hours(hours)
    body = {"tenant": tenant, "allowed_models": list(model) if model else None,
            "allowed_source_prefixes": list(source_prefix) if source_prefix else None,
            "allowed_capacity_classes": list(capacity_class) if capacity_class else None,
            "preempt_other_tenants": preempt_other_tenants,
            "deploy_hour_start": start, "deploy_hour_end": end}
    with session() as c:
        emit_object(c.post("/api/ai/policies", body), as_json)


@policy_app.command("list")
def policy_list(as_json: bool = JSON_OPT) -> None:
    """Every tenant policy you may see."""
    with session() as c:
        emit_table(c.get("/api/ai/policies"), POLICY_COLUMNS, as_json)


@key_policy_app.command("set")
def key_policy_set(
    endpoint: str = typer.Argument(..., metavar="ENDPOINT", help="the endpoint whose keys it governs"),
    max_ttl: int = typer.Option(None, "--max-ttl", help="keys must expire within this many seconds"),
    require_scope: list[str] = typer.Option(None, "--require-scope", help="repeatable: model or tenant"),
    max_request_quota: int = typer.Option(None, "--max-request-quota", help="keys need a quota of at most this"),
    viewer_playground: bool = typer.Option(False, "--viewer-playground",
                                           help="viewers may use the console's playground on ENDPOINT"),
    as_json: bool = JSON_OPT,
) -> None:
    """Set ENDPOINT's key policy (replaces its previous one)."""
    body = {"max_ttl_secs": max_ttl, "required_scopes": list(require_scope or []),
            "max_request_quota": max_request_quota, "viewer_playground": viewer_playground}
    with session() as c:
        emit_object(c.put(f"/api/ai/key-policies/{endpoint}", body), as_json)


@key_policy_app.command("show")
def key_policy_show(endpoint: str = typer.Argument(..., metavar="ENDPOINT", help="the endpoint"), as_json: bool = JSON_OPT) -> None:
    """ENDPOINT's key policy."""
    with session() as c:
        emit_object(c.get(f"/api/ai/key-policies/{endpoint}"), as_json)


def admit(
    file: Path = typer.Option(..., "-f", "--file", help="a deployment (JSON or YAML) or an AdmissionReview"),
    as_json: bool = JSON_OPT,
) -> None:
    """Would this deployment be admitted (tenant policy and quota)? Exit 1 when it would not."""
    try:
        body = yaml.safe_load(file.read_text())
    except (OSError, yaml.YAMLError) as exc:
        fail(f"--file {file}: {getattr(exc, 'strerror', None) or exc}", 2)
    if not isinstance(body, dict):
        fail(f"--file {file}: expected one object", 2)
    with session() as c:
        result = c.post("/api/ai/admit", body)
    verdict = result.get("response", result)
    if as_json:
        emit_json(result)
    elif verdict.get("allowed"):
        typer.echo("allowed")
    else:
        reasons = verdict.get("reasons") or [verdict.get("status", {}).get("message", "")]
        typer.echo("refused: " + "; ".join(reasons))
    if not verdict.get("allowed"):
        raise typer.Exit(1)

