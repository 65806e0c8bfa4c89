"""kubectl habits added to the whole command tree once it is built (so every command gets them,
including ones other modules add later):

  - `-o json|yaml|wide|name` on every command that has `--json` (kept as the alias of -o json):
    `add_output_options` rewrites each such callback's signature to take `-o` too, and the wrapper
    puts the choice (and the command's resource kind, for -o name) in output.CURRENT while the
    command runs, where fabricctl.output's emit functions read it;
  - plural, singular and short names for command groups (`models`, `deployments`, `ep`, ...),
    resolved by AliasGroup and not listed, so help stays short.
"""

from __future__ import annotations

import functools
import inspect
from enum import Enum

import typer
from typer.core import TyperGroup

from fabricctl.output import CURRENT, OutputChoice

# alias -> canonical command name, as kubectl spells them (plural, singular, short).
ALIASES = {
    "models": "model", "mo": "model",
    "profiles": "profile", "pr": "profile",
    "deployments": "deployment", "dep": "deployment",
    "endpoints": "endpoint", "ep": "endpoint",
    "keys": "key",
    "nodes": "node", "no": "node",
    "replicas": "replica", "rep": "replica",
    "ev": "events", "event": "events",
    "ls": "list",
}


class OutputFormat(str, Enum):
    json = "json"
    yaml = "yaml"
    wide = "wide"
    name = "name"


OUTPUT_HELP = "output format: json, yaml, wide (more columns) or name (KIND/NAME)"


class AliasGroup(TyperGroup):
    """A group that also answers to the aliases above."""

    def get_command(self, ctx, cmd_name: str):
        found = super().get_command(ctx, cmd_name)
        if found is None and cmd_name in ALIASES:
            found = super().get_command(ctx, ALIASES[cmd_name])
        return found


def with_output(callback, kind: str):
    """callback with an extra `-o/--output` parameter; --json stays and means -o json."""
    sig = inspect.signature(callback, eval_str=True)
    if "as_json" not in sig.parameters or "output" in sig.parameters:
        return callback

    @functools.wraps(callback)
    def invoke(*args, output: OutputFormat | None = None, **kwargs):
        fmt = output.value if output is not None else ("json" if kwargs.get("as_json") else None)
        if fmt is not None:
            kwargs["as_json"] = fmt in ("json", "yaml")
        token = CURRENT.set(OutputChoice(fmt, kind))
        try:
            return callback(*args, **kwargs)
        finally:
            CURRENT.reset(token)

    params = []
    for p in sig.parameters.values():
        if p.name == "as_json" and isinstance(p.default, typer.models.OptionInfo):
            p.default.help = "alias of -o json"
        params.append(p)
    params.append(inspect.Parameter("output", inspect.Parameter.KEYWORD_ONLY, annotation=OutputFormat | None,
                                    default=typer.Option(None, "-o", "--output", help=OUTPUT_HELP)))
    invoke.__signature__ = sig.replace(parameters=params)
    invoke.__annotations__ = {**{p.name: p.annotation for p in sig.parameters.values()},
                              "output": OutputFormat | None}
    return invoke


def _kind_of(group: str | None, command: str | None) -> str:
    return group or command or "object"


def add_output_options(app: typer.Typer, group: str | None = None) -> None:
    """Give every command under app that has `as_json` the -o option, and every group the
    aliases (recursively)."""
    if app.info.cls is None or app.info.cls is TyperGroup or not isinstance(app.info.cls, type):
        app.info.cls = AliasGroup
    for info in app.registered_commands:
        if info.callback is not None:
            info.callback = with_output(info.callback, _kind_of(group, info.name))
    for sub in app.registered_groups:
        if sub.typer_instance is not None:
            add_output_options(sub.typer_instance, sub.name)
