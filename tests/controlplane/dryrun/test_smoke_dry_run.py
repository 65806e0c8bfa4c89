"""The CI smoke: scripts/smoke-dry-run drives a GPU-less fabricd (FABRIC_DRY_RUN=1, no agent)
through the fabricctl walk-through; this runs it and checks its JSON report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "smoke-dry-run"


def test_the_cli_walk_through_against_a_dry_run_fabricd(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--keep", str(tmp_path)], capture_output=True, text=True,
                          timeout=300, check=False)
    report = json.loads(done.stdout)
    assert done.returncode == 0 and report["ok"], report
    commands = [s["command"] for s in report["steps"]]
    assert any(c.startswith("fabricctl ai deploy demo-llm") for c in commands)
    assert len(set(report["weights"])) == 3 and report["vip"]
    assert all(s["rc"] == 0 for s in report["steps"])
