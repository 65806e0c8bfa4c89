"""The bounded profile of scripts/bench-router (the full run is for the figures in
docs/gateway.md): real gateway and engines, every mode, the JSON shape, and prefix routing's
cache hit rate well above round robin's on the same workload."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench-router"


def test_bench_router_small_profile_reports_every_mode_and_prefix_wins_on_hits():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--replicas", "3", "--systems", "6", "--conversations", "18",
                           "--turns", "3", "--concurrency", "6", "--cache-blocks", "96"],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert set(out["modes"]) == {"prefix", "round_robin", "random"}
    for mode in out["modes"].values():
        assert mode["failures"] == 0 and mode["requests"] == 18 * 3
    assert out["modes"]["prefix"]["hit_rate"] > 1.5 * out["modes"]["round_robin"]["hit_rate"]
    assert 0 < out["setup"]["one_cache_over_working_set"] < 1
