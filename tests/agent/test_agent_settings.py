"""agent/settings.py: the agent reads its environment once, at start. A bad value of any of its
variables stops `fabric-agent serve` with exit 2 and a message naming each bad variable, before
it touches a device; good values reach the parts that use them through AgentState.settings."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from agent.server_cli import serve
from agent.settings import AgentSettings, AgentSettingsError, load
from agent.vm.cloud_init import check_no_secrets
from common.errors import Refused

app = typer.Typer()
app.command("serve")(serve)
app.command("other")(lambda: None)  # two commands: `serve` stays a subcommand, as in fabric-agent


@pytest.mark.parametrize("name, value", [
    ("FABRIC_PCI_MIG", "yes"),
    ("FABRIC_VFIO_KEEP_BOUND", "true"),
    ("FABRIC_UDP_FLOW_SECS", "thirty"),
    ("FABRIC_MISS_INSERTS", "0"),
    ("FABRIC_XDP_FORWARD", "on"),
    ("FABRIC_BGP", "2"),
    ("FABRIC_MODEL_RETRIES", "-1"),
    ("FABRIC_IMAGES_DIR", "images"),
    ("FABRIC_SCRAPE_TIMEOUT_SECS", "0"),
])
def test_serve_refuses_a_bad_value_naming_its_variable(tmp_path, name, value):
    args = ["serve", "--node-id", "n1", "--insecure", "--listen", "127.0.0.1:1", "--vm-driver", "dry-run",
            "--state-dir", str(tmp_path / "state"), "--no-dataplane"]
    out = CliRunner().invoke(app, args, env={name: value})
    assert out.exit_code == 2, out.output
    assert name in out.output and "will not start" in out.output


def test_every_bad_variable_is_named_at_once():
    with pytest.raises(AgentSettingsError) as err:
        load({"FABRIC_PCI_MIG": "x", "FABRIC_BGP": "x", "FABRIC_UDP_FLOW_SECS": "x"})
    assert all(n in str(err.value) for n in ("FABRIC_PCI_MIG", "FABRIC_BGP", "FABRIC_UDP_FLOW_SECS"))


def test_values_are_parsed_once_into_one_frozen_object():
    s = load({"FABRIC_PCI_MIG": "1", "FABRIC_VFIO_KEEP_BOUND": "1", "FABRIC_UDP_FLOW_SECS": "45",
              "FABRIC_MODEL_DIR": "/data/models", "FABRIC_IMAGES_DIR": "/opt/fabric/images",
              "FABRIC_SCRAPE_TIMEOUT_SECS": "7.5"})
    assert s.pci_mig and s.vfio_keep_bound and s.dataplane.udp_flow_secs == 45 and s.scrape_timeout_s == 7.5
    assert s.models.model_dir == "/data/models" and s.images_dir == Path("/opt/fabric/images")
    assert load({}) == AgentSettings()
    with pytest.raises(AttributeError):
        s.pci_mig = False  # type: ignore[misc]


def test_secrets_never_reach_the_settings_repr():
    s = load({"HF_TOKEN": "hf_abcdefghijklmnop", "FABRIC_MODEL_SIGNING_KEY": "k" * 32})
    assert s.models.env["HF_TOKEN"] == "hf_abcdefghijklmnop"
    assert "hf_abcdefghijklmnop" not in repr(s) and "k" * 32 not in repr(s)


def test_the_secrets_are_read_at_start_and_a_seed_holding_one_is_refused():
    env = {"HF_TOKEN": "hf_token_value", "FABRIC_ADMIN_PASSWORD": "password-value", "FABRIC_SITE": "site-a",
           "PATH": "/bin"}
    s = load(env)
    assert dict(s.secrets) == {"HF_TOKEN": "hf_token_value", "FABRIC_ADMIN_PASSWORD": "password-value"}
    assert "password-value" not in repr(s)
    check_no_secrets("hostname: site-a", s.secrets)  # not a secret
    with pytest.raises(Refused, match=r"\$FABRIC_ADMIN_PASSWORD"):
        check_no_secrets("runcmd: [echo, password-value]", s.secrets)
