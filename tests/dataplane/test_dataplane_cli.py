"""`fabric-agent maglev` on live pinned maps, through typer's CliRunner."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from agent.dataplane.cli import maglev_app

runner = CliRunner()


def test_set_show_delete(pin_dir):
    pin = ["--pin-dir", pin_dir]
    result = runner.invoke(maglev_app, ["set", "10.9.0.100:80/tcp", "--backend", "10.1.0.11:8080=1",
                                        "--backend", "10.1.0.12:8080=3", "--flow-entries", "65536", *pin])
    assert result.exit_code == 0, result.output
    assert "updated" in result.output

    result = runner.invoke(maglev_app, ["show", "--json", *pin])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    [svc] = shown["services"]
    assert (svc["vip"], svc["port"], svc["proto"]) == ("10.9.0.100", 80, "tcp")
    shares = {b["address"]: (b["weight"], b["slots"]) for b in svc["backends"]}
    assert shares["10.1.0.11:8080"][0] == 1 and shares["10.1.0.12:8080"][0] == 3
    assert abs(shares["10.1.0.12:8080"][1] - 3 * shares["10.1.0.11:8080"][1]) <= 3
    assert set(shown["verdicts"]) >= {"fwd_new_flow", "drop_no_backend"}

    result = runner.invoke(maglev_app, ["delete", "10.9.0.100:80/tcp", *pin])
    assert result.exit_code == 0 and "deleted" in result.output
    result = runner.invoke(maglev_app, ["delete", "10.9.0.100:80/tcp", *pin])
    assert result.exit_code == 1


def test_bad_input_is_named_and_refused_before_touching_maps(pin_dir):
    result = runner.invoke(maglev_app, ["set", "10.9.0.100:80/sctp", "--backend", "10.1.0.11:8080=1",
                                        "--pin-dir", pin_dir])
    assert result.exit_code == 2 and "protocol" in result.output
    result = runner.invoke(maglev_app, ["set", "10.9.0.100:80/tcp", "--backend", "10.1.0.11:8080",
                                        "--pin-dir", pin_dir])
    assert result.exit_code == 2 and "IP:PORT=WEIGHT" in result.output
