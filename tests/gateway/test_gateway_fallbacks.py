"""The gateway on its two fallbacks, aiohttp's upstream client and uvicorn's own HTTP protocol
(FABRIC_GATEWAY_UPSTREAM_CLIENT=aiohttp, FABRIC_GATEWAY_HTTP_SERVER=uvicorn): the bounded profile
of scripts/test-gateway-fallbacks, which runs the whole gateway suite that way. Here four tests of the
proxy's core module (streaming, refusals, a client leaving, an upstream dying mid-stream) run in a
child pytest with --gateway-fallbacks, and every gateway it started says in its log that it served on both."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODULE = "tests/gateway/test_gateway_auth_proxy.py"
PROFILE = "streaming or refusals or disconnect or upstream_death"  # the bounded profile: proxying, not bookkeeping


def test_the_proxy_module_passes_with_both_fallbacks(tmp_path):
    base = tmp_path / "run"
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--gateway-fallbacks",
                          "--basetemp", str(base), "-k", PROFILE, MODULE], cwd=ROOT, capture_output=True, text=True, timeout=500)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    passed = re.search(r"(\d+) passed", out.stdout)
    assert passed and int(passed.group(1)) >= 4 and " failed" not in out.stdout, out.stdout[-2000:]
    logs = [p.read_text(errors="replace") for p in base.rglob("gateway-*.log")]
    assert logs, "the child run started no gateway"
    for text in logs:
        assert "HTTP server uvicorn (httptools), upstream client aiohttp" in text, text[-1500:]
