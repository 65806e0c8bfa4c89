"""The node agent's KV-index service: keeps the subscriber (agent/kv_index/subscriber.py) watching
every running replica of this node and exports what it knows.

Every SYNC_S it lists the VM driver's replicas; a running one with an address is watched at
``tcp://ADDRESS:5557`` (PUB) and ``tcp://ADDRESS:5558`` (replay), topic ``kv`` -- where the guest's
vLLM (common/runtimes.VLLM_KV_EVENTS_CONFIG) and the lab's engines publish -- and one that is gone
is forgotten. A replica watched for BLIND_AFTER_S without one event is logged once as blind (an
engine started without --kv-events-config); gateways then route it approximately.

Metrics (the agent's registry): fabric_kv_index_replicas{state="live"|"warming"|"blind"} (warming:
silent for less than BLIND_AFTER_S; agent/kv_index/subscriber.KvEventSubscriber.states),
fabric_kv_index_blocks{replica}, fabric_kv_index_gaps_total{replica},
fabric_kv_index_resyncs_total{replica}.
"""

from __future__ import annotations

import logging
import threading
import time

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from agent.kv_index.subscriber import EventSource, KvEventSubscriber
from common.kv_index import KvIndex
from common.runtimes import VLLM_KV_EVENTS_PORT, VLLM_KV_REPLAY_PORT

log = logging.getLogger(__name__)
SYNC_S = 2.0
BLIND_AFTER_S = 60.0
TOPIC = "kv"


def runs_simulators(vm_driver) -> bool:
    """Whether this node's vLLM replicas are fabric-engine-sim (dry-run, or the lab without
    FABRIC_LAB_ENGINE=vllm): their tokens are the simulator's, not the model's tokenizer's."""
    name = getattr(vm_driver, "name", "")
    if name == "dry-run":
        return True
    if name == "lab":
        engine = getattr(vm_driver, "engine", None)
        return not (engine is not None and engine.real_for("vllm"))
    return False


def source_for(replica: str, address: str) -> EventSource:
    host = f"[{address}]" if ":" in address else address
    return EventSource(replica, f"tcp://{host}:{VLLM_KV_EVENTS_PORT}", f"tcp://{host}:{VLLM_KV_REPLAY_PORT}", TOPIC)


class KvIndexService:
    def __init__(self, vm_driver, registry=None, sync_s: float = SYNC_S, source=source_for,
                 blind_after_s: float = BLIND_AFTER_S) -> None:
        self.subscriber = KvEventSubscriber(KvIndex())
        self._source = source  # (replica, address) -> EventSource
        self._driver = vm_driver
        self._sync_s = sync_s
        self.blind_after_s = blind_after_s
        self._watched: dict[str, str] = {}  # replica -> address
        self._warned: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="kv-index-sync")
        if registry is not None:
            registry.register(_Collector(self))
        self._thread.start()

    def sync(self, statuses) -> None:
        """Watch the running replicas with an address; forget the rest."""
        want = {s.id: s.host for s in statuses if s.state == "running" and s.host}
        for replica, address in want.items():
            if self._watched.get(replica) != address:
                self.subscriber.watch(self._source(replica, address))
                self._watched[replica] = address
        for replica in list(self._watched):
            if replica not in want:
                self.subscriber.forget(replica)
                del self._watched[replica]
                self._warned.discard(replica)
        for replica, st in self.subscriber.status().items():
            age = time.monotonic() - self.subscriber.index.replicas[replica].watched_since \
                if replica in self.subscriber.index.replicas else 0.0
            if not st["events"] and age > self.blind_after_s and replica not in self._warned:
                self._warned.add(replica)
                log.warning("kv-index: replica %s sent no KV events in %.0f s (engine without "
                            "--kv-events-config?); gateways route it approximately", replica, age)

    def _run(self) -> None:
        while not self._stop.wait(self._sync_s):
            try:
                self.sync(self._driver.list())
            except Exception:  # a driver hiccup must not end the index
                log.exception("kv-index: listing replicas failed")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=3)
        self.subscriber.close()


class _Collector:
    def __init__(self, service: KvIndexService) -> None:
        self._service = service

    def collect(self):
        status = self._service.subscriber.status()
        states = GaugeMetricFamily("fabric_kv_index_replicas", "Replicas the KV index watches, by whether they "
                                   "have sent KV events (warming: none yet; blind: none in 60 s)", labels=["state"])
        by_state = self._service.subscriber.states(list(status), self._service.blind_after_s)
        for state in ("live", "warming", "blind"):
            states.add_metric([state], sum(1 for s in by_state.values() if s == state))
        blocks = GaugeMetricFamily("fabric_kv_index_blocks", "KV blocks the index holds per replica",
                                   labels=["replica"])
        gaps = CounterMetricFamily("fabric_kv_index_gaps", "Sequence gaps in a replica's KV events",
                                   labels=["replica"])
        resyncs = CounterMetricFamily("fabric_kv_index_resyncs", "Replicas' indexes rebuilt after a gap the "
                                      "replay could not fill", labels=["replica"])
        for replica, s in status.items():
            blocks.add_metric([replica], s["blocks"])
            gaps.add_metric([replica], s["gaps"])
            resyncs.add_metric([replica], s["resyncs"])
        yield from (states, blocks, gaps, resyncs)
