"""Prometheus view of the dataplane, read from the live maps at scrape time.

    fabric_dataplane_verdicts_total{verdict}                    packets per verdict code
    fabric_dataplane_flow_misses_total{vip,port,proto,kind}     connection-table misses per service;
                                                                kind="syn" (a SYN that picked) or
                                                                "non_syn" (any other packet, UDP included,
                                                                that found no entry: eviction, flood, restart)
Labels carry only operator-chosen service addresses and fixed names.
"""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily


class DataplaneCollector:
    def __init__(self, dataplane) -> None:
        self._dp = dataplane

    def collect(self):
        verdicts = CounterMetricFamily("fabric_dataplane_verdicts", "Packets per dataplane verdict", labels=["verdict"])
        for name, value in sorted(self._dp.verdict_counters().items()):
            verdicts.add_metric([name], value)
        yield verdicts
        misses = CounterMetricFamily("fabric_dataplane_flow_misses", "Connection-table misses per service",
                                     labels=["vip", "port", "proto", "kind"])
        for addr, m in sorted(self._dp.flow_misses().items()):
            misses.add_metric([addr.vip, str(addr.port), addr.proto, "syn"], m.syn)
            misses.add_metric([addr.vip, str(addr.port), addr.proto, "non_syn"], m.other)
        yield misses

    def describe(self):
        return []  # collected live; nothing to check at registration
