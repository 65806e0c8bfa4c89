"""The agent's site comes from FABRIC_SITE (or --site); a name that is not a DNS label stops
`fabric-agent serve` before it binds anything, naming the variable."""

import typer
from typer.testing import CliRunner

from agent.server_cli import serve

app = typer.Typer()
app.command("serve")(serve)
app.command("other")(lambda: None)  # two commands: `serve` stays a subcommand, as in fabric-agent


def test_fabric_site_is_read_and_checked(tmp_path):
    args = ["serve", "--node-id", "n1", "--insecure", "--listen", "127.0.0.1:1", "--vm-driver", "dry-run",
            "--state-dir", str(tmp_path)]
    bad = CliRunner().invoke(app, args, env={"FABRIC_SITE": "EU West"})
    assert bad.exit_code == 2 and "FABRIC_SITE" in bad.output and "DNS label" in bad.output
    flag = CliRunner().invoke(app, [*args, "--site", "eu_west"])
    assert flag.exit_code == 2 and "DNS label" in flag.output
