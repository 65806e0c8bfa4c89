"""A real Prometheus (Debian's `prometheus`) scraping a running lab with docs/dashboards/prometheus.yml,
then every dashboard panel's query and every alert rule's expression evaluated against what it
scraped. Used by tests/e2e/test_lab_cli_dirs.py on its lab after the demo (so there is traffic).

The shipped config is used as it is, but for its targets and file paths (the lab's ports, its CA,
and fabricd's client certificate for the agents' mutual TLS) and a 1 s scrape interval; promtool
checks the rewritten file in full (files included) before Prometheus starts. Prometheus listens on
loopback, keeps its data in a temporary directory and is stopped before the helper returns.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import httpx
import yaml

from common.pki import pki_dir
from lab.cluster import LabConfig
from lab.rigs.servers import free_port

DASH = Path(__file__).resolve().parents[2] / "docs" / "dashboards"
PROMETHEUS, PROMTOOL = "/usr/bin/prometheus", "/usr/bin/promtool"


def lab_config(cfg: LabConfig) -> dict:
    conf = yaml.safe_load((DASH / "prometheus.yml").read_text())
    conf["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    conf["rule_files"] = [str(DASH / "fabric-alerts.yml")]
    pki = pki_dir(cfg.fabricd_dir)
    ports = {"fabricd": cfg.api_port, "fabric-gateway": cfg.gateway_port, "fabric-agent": cfg.agent_port}
    for job in conf["scrape_configs"]:
        job["static_configs"] = [{"targets": [f"127.0.0.1:{ports[job['job_name']]}"]}]
        tls = job["tls_config"]
        tls["ca_file"] = str(cfg.ca)
        if "cert_file" in tls:  # the agents': fabricd's own client certificate (CN fabricd)
            tls["cert_file"], tls["key_file"] = str(pki / "fabricd.crt"), str(pki / "fabricd.key")
    return conf


def dashboard_queries() -> list[str]:
    dash = json.loads((DASH / "fabric.json").read_text())
    return [t["expr"].replace("$__rate_interval", "1m").replace("$endpoint", ".*")
            for p in dash["panels"] for t in p.get("targets", [])]


def rule_queries() -> list[str]:
    doc = yaml.safe_load((DASH / "fabric-alerts.yml").read_text())
    return [r["expr"] for g in doc["groups"] for r in g["rules"]]


def _wait(what: str, check, timeout: float, every: float = 0.5):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last and last[0]:
            return last[1]
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}: {last[1] if last else ''}")


def scrape_lab_and_query(cfg: LabConfig, tmp: Path) -> dict[str, int]:
    """Returns {query: number of series it gave}; raises on any query Prometheus refuses."""
    conf_path = tmp / "prometheus.yml"
    conf_path.write_text(yaml.safe_dump(lab_config(cfg), sort_keys=False))
    checked = subprocess.run([PROMTOOL, "check", "config", str(conf_path)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = open(tmp / "prometheus.log", "wb")  # noqa: SIM115 - closed in finally
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={conf_path}", f"--storage.tsdb.path={tmp / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    try:
        def ready():
            if proc.poll() is not None:
                return False, (tmp / "prometheus.log").read_text()[-2000:]
            try:
                return httpx.get(f"{base}/-/ready", timeout=2).status_code == 200, "not ready"
            except httpx.HTTPError as exc:
                return False, str(exc)
        _wait("Prometheus to be ready", ready, 30)

        def targets_up():
            active = httpx.get(f"{base}/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
            health = {t["labels"]["job"]: (t["health"], t.get("lastError", "")) for t in active}
            return len(health) == 3 and all(h == "up" for h, _ in health.values()), health
        _wait("fabricd, the gateway and the agent to be scraped", targets_up, 30)

        def query(expr: str) -> list[dict]:
            answer = httpx.get(f"{base}/api/v1/query", params={"query": expr}, timeout=10).json()
            assert answer.get("status") == "success", (expr, answer)
            return answer["data"]["result"]

        # Two scrapes of the controllers at least, so rate() has points; the label is the
        # controller's own, next to the scrape job's (no exported_job).
        _wait("two scrapes of the controller counters",
              lambda: (len(query("count_over_time(fabric_controller_ticks_total[1m])")) > 0
                       and min(float(r["value"][1]) for r in query(
                           "count_over_time(fabric_controller_ticks_total[1m])")) >= 2, "fewer than 2"), 30)
        ticks = query("fabric_controller_ticks_total")
        assert ticks and all(r["metric"].get("controller") and r["metric"]["job"] == "fabricd"
                             and "exported_job" not in r["metric"] for r in ticks), ticks[:3]
        return {expr: len(query(expr)) for expr in dashboard_queries() + rule_queries()}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
