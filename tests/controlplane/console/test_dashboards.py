"""docs/dashboards/: the alert rules and the Grafana dashboard use only series the code exports,
promtool (Debian's `prometheus` package) accepts every expression and the rules' unit tests pass,
and fabricd's /metrics really carries the GPU readings the GPU panels and alerts use.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[3]
DASH = REPO / "docs" / "dashboards"
PROMTOOL = "/usr/bin/promtool"
SOURCES = ("common", "controlplane", "agent", "gateway")
DEFINITION = re.compile(r'\b(Counter|Gauge|Histogram|Summary|CounterMetricFamily|GaugeMetricFamily)\(\s*"([a-z_:]+)"')
SERIES = re.compile(r"\b(fabricd?_[a-z0-9_]+)")


def exported_series() -> set[str]:
    """Every series name the code can expose, as Prometheus text names it."""
    out: set[str] = set()
    for top in SOURCES:
        for path in (REPO / top).rglob("*.py"):
            for kind, name in DEFINITION.findall(path.read_text()):
                if kind.startswith("Counter"):
                    out.add(name.removesuffix("_total") + "_total")
                elif kind in ("Histogram", "Summary"):
                    out.update({f"{name}_bucket", f"{name}_sum", f"{name}_count"} if kind == "Histogram"
                               else {f"{name}_sum", f"{name}_count"})
                else:
                    out.add(name)
    return out


def rule_exprs() -> list[str]:
    doc = yaml.safe_load((DASH / "fabric-alerts.yml").read_text())
    return [r["expr"] for g in doc["groups"] for r in g["rules"]]


def dashboard_exprs() -> list[str]:
    dash = json.loads((DASH / "fabric.json").read_text())
    return [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]


def promtool(*args: str, cwd: Path = DASH) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def test_rules_pass_promtool_check_and_their_unit_tests():
    checked = promtool("check", "rules", "fabric-alerts.yml")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = promtool("test", "rules", "fabric-alerts.test.yml")
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_every_dashboard_query_is_valid_promql(tmp_path):
    # Grafana's variables become plain values; each query becomes a recording rule promtool parses.
    exprs = [e.replace("$__rate_interval", "5m").replace("$endpoint", ".*") for e in dashboard_exprs()]
    rules = {"groups": [{"name": "dashboard", "rules": [{"record": f"fabric:dashboard_{i}", "expr": e}
                                                          for i, e in enumerate(exprs)]}]}
    (tmp_path / "dash.yml").write_text(yaml.safe_dump(rules))
    checked = promtool("check", "rules", "dash.yml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert len(exprs) >= 25


def test_rules_and_dashboard_use_only_exported_series():
    exported = exported_series()
    assert {"fabric_gateway_requests_total", "fabric_dataplane_verdicts_total", "fabric_gpu_temperature_celsius",
            "fabric_routing_weight", "fabric_gateway_ttft_seconds_bucket"} <= exported
    used = {name for e in rule_exprs() + dashboard_exprs() for name in SERIES.findall(e)}
    assert used, "no series found in the dashboards"
    assert not used - exported, f"series nobody exports: {sorted(used - exported)}"
    # The list: requests, errors, latency, TTFT, weights, traffic, verdicts, LRU misses,
    # GPU readings, controller ticks and failures, limit refusals.
    for needed in ("fabric_gateway_requests_total", "fabric_gateway_latency_seconds_bucket",
                   "fabric_gateway_ttft_seconds_bucket", "fabric_routing_weight", "fabric_dataplane_verdicts_total",
                   "fabric_dataplane_flow_misses_total", "fabric_gpu_temperature_celsius", "fabric_gpu_power_watts",
                   "fabric_gpu_ecc_uncorrected", "fabric_controller_ticks_total"):
        assert needed in used, needed


def test_fabricd_exports_the_gpu_readings_of_registered_nodes(cluster):
    with cluster.server.client() as c:
        text = c.get("/metrics").text
    want = {"node": "gpu-node-1", "pci": "0000:3b:01.0", "gpu": "NVIDIA H100"}
    got = {s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples
           if s.name.startswith("fabric_gpu_") and s.labels == want}
    assert got == {"fabric_gpu_temperature_celsius": 42.0, "fabric_gpu_power_watts": 121.0,
                   "fabric_gpu_ecc_uncorrected": 1.0, "fabric_gpu_memory_used_bytes": 2048 * 1024 * 1024,
                   "fabric_gpu_memory_total_bytes": 81559 * 1024 * 1024,
                   "fabric_gpu_allocated": 0.0,  # dry-run replicas hold no GPU
                   "fabric_gpu_lost": 0.0}


def test_the_shipped_scrape_config_is_valid_and_scrapes_all_three_with_the_agents_client_certificate():
    checked = promtool("check", "config", "--syntax-only", "prometheus.yml")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    conf = yaml.safe_load((DASH / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in conf["scrape_configs"]}
    assert set(jobs) == {"fabricd", "fabric-gateway", "fabric-agent"}
    assert all(j["scheme"] == "https" and j["tls_config"]["ca_file"] for j in jobs.values())
    assert {"cert_file", "key_file"} <= set(jobs["fabric-agent"]["tls_config"])  # the agents' mutual TLS
    assert conf["rule_files"] == ["fabric-alerts.yml"]


def test_no_fabric_series_carries_a_label_prometheus_reserves_for_the_scrape():
    """A label named job or instance is renamed exported_job/exported_instance by a default
    scrape, so the panels grouping by it would group by the scrape job instead."""
    labelled = re.compile(r'\b(?:Counter|Gauge|Histogram|Summary)\(\s*"fabric[a-z_]*",[^)]*?\[([^\]]*)\]', re.S)
    for top in SOURCES:
        for path in (REPO / top).rglob("*.py"):
            for labels in labelled.findall(path.read_text()):
                names = {n.strip().strip("'\"") for n in labels.split(",")}
                assert not names & {"job", "instance"}, (path, labels)


def paging_rules() -> dict[str, str]:
    doc = yaml.safe_load((DASH / "fabric-alerts.yml").read_text())
    return {r["alert"]: r["expr"] for g in doc["groups"] if g["name"] == "fabric-paging" for r in g["rules"]}


def test_fabricd_exports_every_series_the_paging_alerts_read(cluster):
    rules = paging_rules()
    assert set(rules) == {"FabricNodeNotHeartbeating", "FabricDeploymentReplicasNotReady", "FabricBackupTooOld",
                          "FabricStoreUnreachable", "FabricLeaderFlapping"}
    with cluster.server.client() as c:
        text = c.get("/metrics").text
    samples = [s for fam in text_string_to_metric_families(text) for s in fam.samples]
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in samples}
    assert got[("fabric_store_up", ())] == 1.0
    assert got[("fabric_backup_last_success_timestamp_seconds", ())] == 0.0  # no backup yet: the alert fires
    assert got[("fabric_node_last_heartbeat_timestamp_seconds", (("node", "gpu-node-1"),))] > 0
    assert ("fabric_node_replicas", (("node", "gpu-node-1"),)) in got
    assert got[("fabric_deployment_replicas_desired", (("deployment", "chat"),))] == 3.0
    assert got[("fabric_deployment_replicas_ready", (("deployment", "chat"),))] == 3.0
    assert got[("fabric_controller_leader_changes_total", (("change", "took"),))] >= 1.0
    exported = {s.name for s in samples}
    used = {name for expr in rules.values() for name in SERIES.findall(expr)}
    assert used <= exported, sorted(used - exported)


def test_the_gateway_exports_fabric_store_up_from_its_readiness_probe(tmp_path):
    import asyncio

    from common.store.connect import open_store
    from gateway.metrics import GatewayMetrics
    from gateway.readiness import store_failure

    class Unreachable:
        def get(self, key):
            raise ConnectionError("etcd is down")

    metrics = GatewayMetrics.create()
    store = open_store(None, tmp_path)
    try:
        for the_store, want in ((store, 1.0), (Unreachable(), 0.0)):
            metrics.store_up.set(0 if asyncio.run(store_failure(the_store)) else 1)
            fams = {f.name: f for f in text_string_to_metric_families(metrics.exposition().decode())}
            assert [s.value for s in fams["fabric_store_up"].samples] == [want]
    finally:
        store.close()
