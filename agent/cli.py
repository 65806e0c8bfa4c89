"""`fabric-agent`: the node agent's command line.

  fabric-agent serve ...       run the agent (GPU inventory, VMs, dataplane, heartbeat, mTLS API)
  fabric-agent maglev ...      operator debugging of the live XDP Maglev maps
"""

from __future__ import annotations

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Fabric node agent", rich_markup_mode=None,
                  pretty_exceptions_enable=False, context_settings={"help_option_names": ["-h", "--help"]})


def _register() -> None:
    from agent.dataplane.cli import maglev_app
    from agent.server_cli import serve

    app.add_typer(maglev_app, name="maglev")
    app.command("serve")(serve)


def main() -> None:
    from common.cli_guard import run_guarded

    _register()
    run_guarded(lambda: app(prog_name="fabric-agent"), "fabric-agent")


if __name__ == "__main__":
    main()
