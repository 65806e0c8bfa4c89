"""Replicas that send no KV events, as a gateway sees them (docs/kv-events.md).

The agents' match answer says, per replica, ``state``: live, warming, blind (watched 60 s without
one event: an engine started without --kv-events-config) or unwatched; the gateway adds refused
(the agent answered 403: its --kv-index-client-cn does not name this gateway's certificate) and
no_answer (the agent did not answer in time). Every replica that is not live is scored by the
approximate tree for that call (gateway/replica_router.py).

``BlindWatch.observe`` turns one endpoint's states into

  - the gauge ``fabric_gateway_kv_blind_replicas{endpoint}``: its replicas now blind (kept right
    without traffic by gateway/kv_source.py's refresh; ``forget`` drops an endpoint's series);
  - the counter ``fabric_gateway_kv_blind_calls_total{endpoint}``: calls routed while at least
    one of its replicas was blind;
  - one event per change (kind replica): ``KvEventsMissing`` (Warning) when a replica becomes
    blind, ``KvEventsResumed`` when a blind one sends events again.

Labels carry the endpoint name only; replica ids are in the events and the explanations.
``KvEventsMissing`` is written once per replica per gateway process, not per call.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from common.records import events

MAX_TRACKED = 10_000  # replicas remembered; the least recently seen go first
MISSING = ("the replica has sent no KV events to its node's index (engine started without "
           "--kv-events-config?); the gateway routes it with the approximate prefix router")
RESUMED = "the replica sends KV events again; the gateway routes it on what its engine holds"


def store_event_writer(store, gateway_id: str) -> Callable[[str, str, str, str], None]:
    """(name, action, message, type) -> one event record in the store's event log, through the
    one event writer (common.records.events.record_event, which also keeps the log bounded)."""

    def write(name: str, action: str, message: str, type_: str) -> None:
        events.record_event(store, "replica", name, action, f"{message} (gateway {gateway_id})", type=type_)

    return write


@dataclass
class BlindWatch:
    set_blind: Callable[[str, int], None] | None = None  # (endpoint, replicas blind now)
    count_call: Callable[[str], None] | None = None  # (endpoint)
    write_event: Callable[[str, str, str, str], None] | None = None  # (replica, action, message, type)
    drop_endpoint: Callable[[str], None] | None = None  # (endpoint): its gauge series removed
    _blind: OrderedDict[str, bool] = field(default_factory=OrderedDict)  # replica -> blind now

    @classmethod
    def exported(cls, registry, write_event=None) -> BlindWatch:
        """With the gauge and counter registered in the gateway's registry (GatewayMetrics.registry)."""
        from prometheus_client import Counter, Gauge

        gauge = Gauge("fabric_gateway_kv_blind_replicas", "Replicas of the endpoint whose engines sent no "
                      "KV events (routed approximately)", ["endpoint"], registry=registry,
                      multiprocess_mode="mostrecent")
        calls = Counter("fabric_gateway_kv_blind_calls", "Calls routed while a replica of the endpoint "
                        "was blind to the KV index", ["endpoint"], registry=registry)
        def drop(ep: str) -> None:
            try:
                gauge.remove(ep)
            except KeyError:  # never set
                pass

        return cls(lambda ep, n: gauge.labels(ep).set(n), lambda ep: calls.labels(ep).inc(), write_event, drop)

    def forget(self, endpoint: str) -> None:
        """The endpoint is gone (or no longer routes by prefix): no gauge for it."""
        if self.drop_endpoint is not None:
            self.drop_endpoint(endpoint)

    def observe(self, endpoint: str, states: dict[str, str], call: bool = True) -> list[str]:
        """The replicas of this answer that are blind; metrics and events updated (``call``
        False: a refresh, not a routed call, so the calls counter stays)."""
        blind = sorted(r for r, s in states.items() if s == "blind")
        for replica, state in states.items():
            if state not in ("blind", "live"):
                continue  # warming, unwatched, no answer: not known either way
            was = self._blind.get(replica)
            now_blind = state == "blind"
            self._blind[replica] = now_blind
            self._blind.move_to_end(replica)
            if now_blind and not was:
                self._event(replica, "KvEventsMissing", MISSING, "Warning")
            elif was and not now_blind:
                self._event(replica, "KvEventsResumed", RESUMED, "Normal")
        while len(self._blind) > MAX_TRACKED:
            self._blind.popitem(last=False)
        if self.set_blind is not None:
            self.set_blind(endpoint, len(blind))
        if blind and call and self.count_call is not None:
            self.count_call(endpoint)
        return blind

    def _event(self, replica: str, action: str, message: str, type_: str) -> None:
        if self.write_event is None:
            return
        try:
            self.write_event(replica, action, message, type_)
        except Exception:  # the event log is best effort: a store hiccup must not fail a call
            pass
