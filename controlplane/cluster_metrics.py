"""The cluster's state as Prometheus series on fabricd's /metrics, read from the store at scrape time.

One snapshot per scrape serves every family here and the GPU readings (controlplane.gpu_metrics),
so each fabricd reports the same values whichever holds the lease; the alerts that page first
(docs/dashboards/fabric-alerts.yml) read these:

    fabric_store_up                                       1 when this scrape read the store, else 0
    fabric_node_last_heartbeat_timestamp_seconds{node}    the node's last heartbeat (epoch seconds)
    fabric_node_replicas{node}                            replicas placed on the node (what it strands)
    fabric_deployment_replicas_desired{deployment}        the replicas the spec asks for
    fabric_deployment_replicas_ready{deployment}          replicas that are ready now
    fabric_backup_last_success_timestamp_seconds          the last `fabricd backup create` (0: never)

Labels are node ids and deployment names: bounded by what operators create, never by requests.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from common.records.backup_status import last_success
from common.store.base import Store
from controlplane.gpu_metrics import gpu_families
from controlplane.orchestration_state import Snapshot, load_snapshot

log = logging.getLogger("fabricd.cluster_metrics")


def cluster_families(snap: Snapshot) -> list[GaugeMetricFamily]:
    heartbeat = GaugeMetricFamily("fabric_node_last_heartbeat_timestamp_seconds",
                                  "When the node last heartbeated (epoch seconds)", labels=["node"])
    placed = GaugeMetricFamily("fabric_node_replicas", "Replicas placed on the node", labels=["node"])
    desired = GaugeMetricFamily("fabric_deployment_replicas_desired", "Replicas the deployment asks for",
                                labels=["deployment"])
    ready = GaugeMetricFamily("fabric_deployment_replicas_ready", "Replicas of the deployment ready now",
                              labels=["deployment"])
    per_node = Counter(r.node for r in snap.all_replicas() if r.node)
    for node in sorted(snap.nodes.values(), key=lambda n: n.id):
        heartbeat.add_metric([node.id], float(node.last_heartbeat))
        placed.add_metric([node.id], float(per_node.get(node.id, 0)))
    for name in sorted(snap.deployments):
        desired.add_metric([name], float(snap.deployments[name].replicas))
        ready.add_metric([name], float(sum(1 for r in snap.replicas.get(name, []) if r.ready)))
    return [heartbeat, placed, desired, ready]


class ClusterCollector(Collector):
    def __init__(self, store: Store):
        self._store = store

    def collect(self) -> Iterable[GaugeMetricFamily]:
        up = GaugeMetricFamily("fabric_store_up", "1 when this process read the store at the last scrape")
        backup = GaugeMetricFamily("fabric_backup_last_success_timestamp_seconds",
                                   "When the last backup archive was written (epoch seconds; 0: never)")
        try:
            snap = load_snapshot(self._store)
            status = last_success(self._store)
        except Exception:
            log.warning("cluster series skipped: the store could not be read", exc_info=True)
            up.add_metric([], 0.0)
            return [up, *gpu_families(Snapshot())]
        up.add_metric([], 1.0)
        backup.add_metric([], status.at if status is not None else 0.0)
        return [up, backup, *cluster_families(snap), *gpu_families(snap)]
