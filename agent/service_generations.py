"""Maglev services applied in plan-generation order (docs/dataplane.md "Generations").

Every service fabricd pushes carries the generation of the published plan it comes from
(common.records.plans). ``ServiceGenerations.put`` checks the generation and writes the maps
under one lock, so two PUTs of one service that race (a slow one from an earlier pass and the
current one, on two threads of the API's pool) are applied in generation order: the older one
is refused with 409 ``stale_generation`` and writes nothing, whichever arrives last. An equal
generation is applied again (a re-send after a lost answer writes nothing new).

What the agent holds is reported with every heartbeat (``report``): only services the dataplane
still has, so a service removed behind the API's back (the fail-closed withdrawal, the
``fabric-agent maglev`` CLI) or an agent restart (held generations live in memory; the maps
survive) shows as missing, and fabricd sends it again. Generation 0 (a hand PUT with no plan)
is held as 0: any plan's generation replaces it.
"""

from __future__ import annotations

import threading
from typing import Any

from common.agent_api import MaglevServiceSpec, service_key
from common.errors import Conflict


class StaleGeneration(Conflict):
    """409: the service's generation is older than the one the agent holds."""

    def __init__(self, key: str, generation: int, held: int):
        super().__init__(f"service {key}: generation {generation} is older than the generation {held} this "
                         "agent holds; a newer plan was applied already", code="stale_generation")
        self.held = held


class ServiceGenerations:
    """The generation of each service this agent wrote, and the one lock its writers share."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, int] = {}

    def put(self, dataplane: Any, vip: str, port: int, proto: str, spec: MaglevServiceSpec) -> bool:
        """Write the service unless its generation is older than the held one (StaleGeneration);
        True when the maps changed."""
        key = service_key(vip, port, proto)
        with self._lock:
            held = self._held.get(key, 0)
            if spec.generation < held:
                raise StaleGeneration(key, spec.generation, held)
            changed = dataplane.put_service(vip, port, proto, dict(spec.backends), draining=tuple(spec.draining),
                                            forwarding=spec.forwarding)
            self._held[key] = spec.generation
            return bool(changed)

    def delete(self, dataplane: Any, vip: str, port: int, proto: str) -> bool:
        """Remove the service and forget its generation (a later endpoint may reuse the VIP)."""
        with self._lock:
            self._held.pop(service_key(vip, port, proto), None)
            return bool(dataplane.delete_service(vip, port, proto))

    def held(self, key: str) -> int:
        with self._lock:
            return self._held.get(key, 0)

    def report(self, dataplane: Any) -> dict[str, int]:
        """Generation per service the dataplane holds now (its ``readiness`` rows: two map reads);
        a service written by hand or before a restart reports 0."""
        present = [service_key(vip, port, proto) for vip, port, proto, *_ in dataplane.readiness()]
        with self._lock:
            return {key: self._held.get(key, 0) for key in present}
