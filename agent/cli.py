"""`fabric-agent`: the node agent's command line.

  fabric-agent serve ...       run the agent (GPU inventory, VMs, dataplane, heartbeat, mTLS API)
  fabric-agent join ...        trade a join token for this node's certificate (agent.join)
  fabric-agent renew-cert ...  renew it before it expires
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
    from agent.join_cli import join, renew_cert

    app.command("join")(join)
    app.command("renew-cert")(renew_cert)


def main() -> None:
    from common.cli_guard import run_guarded

    _register()
    run_guarded(lambda: app(prog_name="fabric-agent"), "fabric-agent")


if __name__ == "__main__":
    main()
