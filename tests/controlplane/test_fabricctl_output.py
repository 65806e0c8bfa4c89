"""How fabricctl prints for people (fabricctl.output), as plain data: numbers,
times, records inside lists; -o json keeps the server's values."""

from __future__ import annotations

import json
import time

import pytest
import typer
from typer.testing import CliRunner

from fabricctl import output
from fabricctl.output import OutputChoice, age, emit_object, number, when

NOW = 1_796_160_000.0  # 2026-12-01 21:20:00 UTC


@pytest.mark.parametrize("value,shown", [(1.79616e9, "1796160000"), (13.333333333333334, "13.333"), (24.0, "24"),
                                         (79.6, "79.6"), (0.5, "0.5"), (34.5291, "34.529"), (-2.25, "-2.25")])
def test_numbers_are_rounded_without_exponents(value, shown):
    assert number(value) == shown


def test_times_are_dates_with_their_age():
    assert when(NOW - 3, NOW) == "2026-12-01 21:19:57 UTC (3s ago)"
    assert when(NOW + 600, NOW) == "2026-12-01 21:30:00 UTC (in 10m)"
    assert [age(s) for s in (59, 61, 7200, 90000)] == ["59s", "1m", "2h", "1d"]


def run(record: dict, fmt: str | None, **kw) -> str:
    app = typer.Typer()

    @app.command()
    def show() -> None:
        token = output.CURRENT.set(OutputChoice(fmt, "node"))
        try:
            emit_object(record, **kw)
        finally:
            output.CURRENT.reset(token)

    result = CliRunner().invoke(app, [])
    assert result.exit_code == 0, result.output
    return result.output


LIVE = time.time()  # emit_object reads the clock: the record's times are just before it
NODE = {"id": "n1", "last_heartbeat": LIVE - 5, "cpu_free": 125, "ratio": 13.333333333333334, "site": "",
        "gpus": [{"index": 0, "pci": "0000:3b:00.0", "mig_profile": None, "memory_total_mib": 81559},
                 {"index": 1, "pci": "0000:3c:00.0", "mig_profile": None, "memory_total_mib": 81559}],
        "status": {"phase": "Ready", "created_at": LIVE - 90}}


def test_an_object_for_people_has_no_reprs_or_raw_epochs():
    text = run(NODE, None)
    assert "{'" not in text and "e+09" not in text and "None" not in text
    lines = {line.split()[0]: line.split(None, 1)[1] if len(line.split()) > 1 else "" for line in text.splitlines()
             if line.strip()}
    assert lines["last_heartbeat"].startswith("20") and lines["last_heartbeat"].endswith("ago)")
    assert lines["ratio"] == "13.333" and lines["gpus"] == "2 (below)" and lines["status.phase"] == "Ready"
    assert "GPUS" in text.splitlines() and any(line.split()[:2] == ["INDEX", "PCI"] for line in text.splitlines())
    assert any(line.split()[:2] == ["1", "0000:3c:00.0"] for line in text.splitlines())


def test_json_and_yaml_stay_exact():
    assert json.loads(run(NODE, "json")) == NODE
    assert f"last_heartbeat: {LIVE - 5}" in run(NODE, "yaml")


def test_name_output_finds_a_records_name_in_a_deployment_field():
    assert run({"deployment": "demo", "min_replicas": 1}, "name").strip() == "node/demo"
