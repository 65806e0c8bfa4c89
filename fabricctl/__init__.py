"""`fabricctl`: the operator CLI over fabricd's REST API (typer).

    fabricctl [--context C] [--server URL] [--ca FILE] [--token-file F] ai ... | config ... | completion SHELL

Where fabricd is and how to trust and authenticate to it: flag > FABRIC_* variable (read once at
start, fabricctl.settings) > the current context of ~/.config/fabric/config (fabricctl.contexts).
Every read prints a table or `field: value` lines for people and `-o json|yaml|wide|name`
(`--json` = `-o json`) for scripts (fabricctl.formats adds -o to every command).

Exit statuses (docs/cli.md): 0 done, 1 refused by fabricd (an error answer), 2 usage or
configuration (a bad flag, variable or config file), 3 fabricd unreachable (connection, TLS).
Nothing prints a traceback: an error is one line `error: ...` naming what to fix; an
unexpected failure says so in one line (FABRIC_DEBUG=1 shows the traceback).

Command groups by module: resources (model, profile, deploy, deployment, endpoint, events),
keys (key), nodes (node, gpus), capacity (capacity, endpoint show with live weights),
explain (explain placement|routing, deployment drain), rollouts (deployment history|revise|
rollout), scaling (deployment autoscale, quota), observe (explain failure|scaling), login,
config_cmd (config),
completion. They build on fabricctl.output (`session`, `emit_table`,
`emit_object`, `col`).
"""

from __future__ import annotations

import sys
from importlib.metadata import PackageNotFoundError, version

import typer

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"]}


def fabric_version() -> str:
    try:
        return version("fabric")
    except PackageNotFoundError:
        return "unknown"


def _root_callback(
    ctx: typer.Context,
    context: str = typer.Option(None, "--context", help="use this context of the config file (else FABRIC_CONTEXT, "
                                                        "else current-context)"),
    server: str = typer.Option(None, "--server", help="fabricd URL (overrides FABRIC_URL and the context)"),
    ca: str = typer.Option(None, "--ca", help="CA file that signed fabricd's certificate (overrides FABRIC_CA)"),
    token_file: str = typer.Option(None, "--token-file", help="read the bearer token from this file "
                                                              "(overrides FABRIC_TOKEN)"),
    show_version: bool = typer.Option(False, "--version", is_eager=True, help="print the version and exit"),
) -> None:
    """Fabric operator CLI: models, profiles, deployments and endpoints on GPU VMs."""
    if show_version:
        typer.echo(f"fabricctl {fabric_version()}")
        raise typer.Exit(0)
    from fabricctl.settings import Flags, current, use

    use(current().with_flags(Flags(context=context, server=server, ca=ca, token_file=token_file)))
    if ctx.invoked_subcommand is None:
        typer.echo(ctx.get_help())
        raise typer.Exit(0)


def build_app() -> typer.Typer:
    from fabricctl import (
        aliases,
        backup,
        capacity,
        completion,
        config_cmd,
        credentials,
        declarative,
        explain,
        finops,
        identity,
        keys,
        login,
        mig,
        models,
        nodes,
        observe,
        replicas,
        resources,
        rollouts,
        scaling,
        sites,
        tenancy,
        usage,
    )
    from fabricctl.formats import AliasGroup

    root = typer.Typer(cls=AliasGroup, add_completion=False, context_settings=CONTEXT_SETTINGS,
                       invoke_without_command=True, pretty_exceptions_enable=False, rich_markup_mode=None)
    root.callback()(_root_callback)
    ai = typer.Typer(cls=AliasGroup, help="AI workloads: models, profiles, deployments, endpoints.",
                     no_args_is_help=True)
    root.add_typer(ai, name="ai")
    root.add_typer(config_cmd.config_app, name="config")
    root.command("completion")(completion.completion)
    ai.command("login")(login.login)
    models.register(resources.model_app)  # status, materialize, jobs, verify, evict
    ai.add_typer(resources.model_app, name="model")
    ai.add_typer(resources.profile_app, name="profile")
    ai.command("deploy")(resources.deploy)
    resources.deployment_app.command("drain")(explain.drain)
    resources.deployment_app.command("restart")(explain.restart)
    resources.deployment_app.command("history")(rollouts.history)
    resources.deployment_app.command("revise")(rollouts.revise)
    resources.deployment_app.command("rollout")(rollouts.rollout)
    resources.deployment_app.command("autoscale")(scaling.autoscale)
    ai.add_typer(resources.deployment_app, name="deployment")
    # `endpoint show` adds the live routing view (replicas, reasons, Maglev weights).
    resources.endpoint_app.registered_commands = [
        c for c in resources.endpoint_app.registered_commands if c.callback is not resources.endpoint_show]
    resources.endpoint_app.command("show")(capacity.endpoint_show)
    ai.add_typer(resources.endpoint_app, name="endpoint")
    ai.command("events")(resources.events)
    ai.add_typer(scaling.quota_app, name="quota")
    ai.add_typer(sites.site_app, name="site")
    ai.add_typer(keys.key_app, name="key")
    ai.add_typer(credentials.credential_app, name="credential")
    ai.add_typer(tenancy.user_app, name="user")
    ai.add_typer(tenancy.policy_app, name="policy")
    ai.add_typer(tenancy.key_policy_app, name="key-policy")
    ai.command("admit")(tenancy.admit)
    ai.add_typer(identity.mapping_app, name="identity-mapping")
    ai.add_typer(identity.limits_app, name="tenant-limits")
    ai.add_typer(aliases.alias_app, name="alias")
    have = {c.name for c in nodes.node_app.registered_commands}
    for name, command in (("mig-create", mig.mig_create), ("mig-delete", mig.mig_delete), ("mig-list", mig.mig_list)):
        if name not in have:  # build_app may run more than once in one process
            nodes.node_app.command(name)(command)
    ai.add_typer(nodes.node_app, name="node")
    ai.command("gpus")(nodes.gpus)
    from fabricctl.capacity_fit import capacity_app  # capacity, capacity fit

    ai.add_typer(capacity_app, name="capacity")
    ai.command("finops")(finops.finops)
    ai.command("usage")(usage.usage)
    ai.add_typer(usage.prices_app, name="prices")
    ai.add_typer(usage.budget_app, name="budget")
    ai.add_typer(usage.webhook_app, name="webhook")
    ai.add_typer(usage.notify_app, name="notify")
    explain.explain_app.command("failure")(observe.failure)
    explain.explain_app.command("scaling")(observe.scaling)
    ai.add_typer(explain.explain_app, name="explain")
    declarative.register(ai)
    replicas.register(ai)
    ai.command("backup")(backup.backup)
    ai.command("restore")(backup.restore)
    return root


def build_command():
    """The command tree with -o on every read (what main runs and docs/cli.md describes)."""
    from fabricctl.formats import add_output_options

    app = build_app()
    add_output_options(app)
    return typer.main.get_command(app)


def main(argv: list[str] | None = None) -> None:
    import typer.completion

    from fabricctl.settings import load, use

    settings = load()  # the one read of the environment; the commands get it with settings.current()
    use(settings)
    try:
        typer.completion.completion_init()
        command = build_command()
        command.main(args=argv, prog_name="fabricctl", standalone_mode=True)
    except Exception as exc:
        if settings.debug:
            raise
        typer.echo(f"error: unexpected {type(exc).__name__}: {exc} (a fabricctl bug: please report it; "
                   "FABRIC_DEBUG=1 shows the traceback)", err=True)
        sys.exit(1)
