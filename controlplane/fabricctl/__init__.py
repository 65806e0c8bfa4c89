"""`fabricctl`: the operator CLI over fabricd's REST API (typer).

    fabricctl ai login | model ... | profile ... | deploy ... | deployment ... | endpoint ... | events

Configuration comes from FABRIC_URL, FABRIC_TOKEN, FABRIC_CA (see controlplane.fabricctl.client).
Every command prints a table or `field: value` lines for people and JSON with --json; a server
error prints "error: MESSAGE" on stderr and exits 1.

Command groups by module: resources (model, profile, deploy, deployment, endpoint, events),
keys (key), nodes (node, gpus), capacity (capacity, endpoint show with live weights),
explain (explain placement|routing, deployment drain). They build on
controlplane.fabricctl.output (`session`, `emit_table`, `emit_object`, `col`).
"""

from __future__ import annotations

import typer


def build_app() -> typer.Typer:
    from controlplane.fabricctl import capacity, explain, keys, login, nodes, resources

    root = typer.Typer(help="Fabric operator CLI.", no_args_is_help=True, add_completion=False)
    ai = typer.Typer(help="AI workloads: models, profiles, deployments, endpoints.", no_args_is_help=True)
    root.add_typer(ai, name="ai")
    ai.command("login")(login.login)
    ai.add_typer(resources.model_app, name="model")
    ai.add_typer(resources.profile_app, name="profile")
    ai.command("deploy")(resources.deploy)
    resources.deployment_app.command("drain")(explain.drain)
    ai.add_typer(resources.deployment_app, name="deployment")
    # `endpoint show` adds the live routing view (replicas, reasons, Maglev weights).
    resources.endpoint_app.registered_commands = [
        c for c in resources.endpoint_app.registered_commands if c.callback is not resources.endpoint_show]
    resources.endpoint_app.command("show")(capacity.endpoint_show)
    ai.add_typer(resources.endpoint_app, name="endpoint")
    ai.command("events")(resources.events)
    ai.add_typer(keys.key_app, name="key")
    ai.add_typer(nodes.node_app, name="node")
    ai.command("gpus")(nodes.gpus)
    ai.command("capacity")(capacity.capacity)
    ai.add_typer(explain.explain_app, name="explain")
    return root


def main() -> None:
    build_app()(prog_name="fabricctl")
