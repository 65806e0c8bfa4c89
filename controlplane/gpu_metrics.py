"""GPU readings as Prometheus series on fabricd's /metrics, from the nodes' heartbeats in the store.

Agents report each GPU's temperature, power, ECC and memory in their heartbeats (controlplane/api/
nodes.py); these turn the stored records into gauges at scrape time (controlplane.cluster_metrics
reads the snapshot once per scrape), so one scrape of
fabricd covers every node (dashboards and alert rules in docs/dashboards/ use these):

    fabric_gpu_temperature_celsius{node,pci,gpu}   0 when unknown
    fabric_gpu_power_watts{node,pci,gpu}           0 when unknown
    fabric_gpu_ecc_uncorrected{node,pci,gpu}       uncorrected ECC errors (count as reported)
    fabric_gpu_memory_used_bytes / _total_bytes{node,pci,gpu}
    fabric_gpu_allocated{node,pci,gpu}             1 while a replica holds the GPU (or slice)
    fabric_gpu_lost{node,pci,gpu}                  1 when the GPU fell off the bus
    fabric_gpus_by_class{capacity_class}           GPUs (and MIG slices) replicas of that class hold

Labels are bounded by the hardware (node id, PCI address, model name), never by requests.
"""

from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily

from controlplane.orchestration_state import Snapshot

MIB = 1024 * 1024
LABELS = ["node", "pci", "gpu"]


def gpu_families(snap: Snapshot) -> list[GaugeMetricFamily]:
    """The GPU gauges of one snapshot (controlplane.cluster_metrics reads it once per scrape)."""
    fams = {
        "temp": GaugeMetricFamily("fabric_gpu_temperature_celsius", "GPU temperature (0: unknown)", labels=LABELS),
        "power": GaugeMetricFamily("fabric_gpu_power_watts", "GPU power draw (0: unknown)", labels=LABELS),
        "ecc": GaugeMetricFamily("fabric_gpu_ecc_uncorrected", "Uncorrected ECC errors reported", labels=LABELS),
        "used": GaugeMetricFamily("fabric_gpu_memory_used_bytes", "GPU memory in use", labels=LABELS),
        "total": GaugeMetricFamily("fabric_gpu_memory_total_bytes", "GPU memory", labels=LABELS),
        "alloc": GaugeMetricFamily("fabric_gpu_allocated", "1 while a replica holds the GPU", labels=LABELS),
        "lost": GaugeMetricFamily("fabric_gpu_lost", "1 when the GPU fell off the bus", labels=LABELS),
        "class": GaugeMetricFamily("fabric_gpus_by_class", "GPUs (and MIG slices) held by replicas, by their "
                                   "deployment's capacity class", labels=["capacity_class"]),
    }
    reserved = snap.reserved_by_node()
    for node in sorted(snap.nodes.values(), key=lambda n: n.id):
        for g in node.gpus:
            labels = [node.id, g.pci, g.name]
            fams["temp"].add_metric(labels, float(g.temperature_c))
            fams["power"].add_metric(labels, float(g.power_w))
            fams["ecc"].add_metric(labels, float(g.ecc_uncorrected))
            fams["used"].add_metric(labels, float(g.memory_used_mib * MIB))
            fams["total"].add_metric(labels, float(g.memory_total_mib * MIB))
            fams["alloc"].add_metric(labels, 1.0 if g.pci in reserved.get(node.id, set()) else 0.0)
            fams["lost"].add_metric(labels, 1.0 if g.state == "lost" else 0.0)
    from controlplane.placement.capacity import gpus_by_class

    for cls, count in gpus_by_class(snap.all_replicas(), snap.deployments).items():
        fams["class"].add_metric([cls], float(count))
    return list(fams.values())
