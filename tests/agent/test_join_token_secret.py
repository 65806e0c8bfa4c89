"""Issue 50 (Low): the join token is a secret, so `fabric-agent join` takes it from a file, a
systemd credential or the environment, never from argv (readable by every local user in /proc)."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from agent.join_cli import join, read_token, renew_cert


def test_there_is_no_token_option_on_the_command_line(tmp_path):
    app = typer.Typer()
    app.command("join")(join)
    app.command("renew-cert")(renew_cert)
    res = CliRunner().invoke(app, ["join", "--token", "fjt1.a.b.c", "--node-id", "gpu-1",
                                   "--control-plane", "https://127.0.0.1:9"])
    assert res.exit_code == 2 and "No such option" in res.output
    res = CliRunner().invoke(app, ["join", "--node-id", "gpu-1", "--control-plane", "https://127.0.0.1:9",
                                   "--pki-dir", str(tmp_path)], env={"FABRIC_JOIN_TOKEN": ""})
    assert res.exit_code == 2 and "never on the command line" in res.output


def test_the_token_comes_from_a_file_a_credential_or_the_environment(tmp_path: Path):
    f = tmp_path / "token"
    f.write_text("fjt1.file.secret.ca\n")
    assert read_token(f, {}) == "fjt1.file.secret.ca"
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "fabric-join-token").write_text("fjt1.cred.secret.ca")
    assert read_token(None, {"CREDENTIALS_DIRECTORY": str(creds)}) == "fjt1.cred.secret.ca"
    assert read_token(None, {"FABRIC_JOIN_TOKEN": "fjt1.env.secret.ca"}) == "fjt1.env.secret.ca"
    with pytest.raises(ValueError, match="never on the command line"):
        read_token(None, {})
    with pytest.raises(ValueError, match="cannot read") as exc:
        read_token(tmp_path / "missing", {})
    assert "fjt1" not in str(exc.value)
