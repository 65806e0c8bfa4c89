"""`fabricctl`: the operator CLI over fabricd's REST API (typer).

    fabricctl ai login | model ... | profile ... | deploy ... | deployment ... | endpoint ... | events

Configuration comes from FABRIC_URL, FABRIC_TOKEN, FABRIC_CA (see controlplane.fabricctl.client).
Every command prints a table or `field: value` lines for people and JSON with --json; a server
error prints "error: MESSAGE" on stderr and exits 1.

Other command groups join when their modules exist:
  controlplane.fabricctl.keys      `key_app`              -> fabricctl ai key ...
  controlplane.fabricctl.nodes     `node_app`, `gpus`     -> fabricctl ai node ..., fabricctl ai gpus
  controlplane.fabricctl.capacity  `capacity`             -> fabricctl ai capacity
They build on controlplane.fabricctl.output (`session`, `emit_table`, `emit_object`, `col`).
"""

from __future__ import annotations

import importlib

import typer


def _optional(name: str):
    qualified = f"controlplane.fabricctl.{name}"
    try:
        return importlib.import_module(qualified)
    except ModuleNotFoundError as exc:
        if exc.name != qualified:
            raise
        return None


def build_app() -> typer.Typer:
    from controlplane.fabricctl import login, resources

    root = typer.Typer(help="Fabric operator CLI.", no_args_is_help=True, add_completion=False)
    ai = typer.Typer(help="AI workloads: models, profiles, deployments, endpoints.", no_args_is_help=True)
    root.add_typer(ai, name="ai")
    ai.command("login")(login.login)
    ai.add_typer(resources.model_app, name="model")
    ai.add_typer(resources.profile_app, name="profile")
    ai.command("deploy")(resources.deploy)
    ai.add_typer(resources.deployment_app, name="deployment")
    ai.add_typer(resources.endpoint_app, name="endpoint")
    ai.command("events")(resources.events)

    keys = _optional("keys")
    if keys is not None:
        ai.add_typer(keys.key_app, name="key")
    nodes = _optional("nodes")
    if nodes is not None:
        ai.add_typer(nodes.node_app, name="node")
        ai.command("gpus")(nodes.gpus)
    capacity = _optional("capacity")
    if capacity is not None:
        ai.command("capacity")(capacity.capacity)
    return root


def main() -> None:
    build_app()(prog_name="fabricctl")
