"""Maglev services applied in plan-generation order (docs/dataplane.md "Generations").

Every service fabricd pushes carries the generation of the published plan it comes from
(common.records.plans). ``ServiceGenerations.put`` checks the generation and writes the maps
under one lock, so two PUTs of one service that race (a slow one from an earlier pass and the
current one, on two threads of the API's pool) are applied in generation order: the older one
is refused with 409 ``stale_generation`` and writes nothing, whichever arrives last. An equal
generation is applied again (a re-send after a lost answer writes nothing new).

The held generations are kept in the agent's state directory (``service-generations.json``,
written atomically after the maps and only when a generation moves; a batch PUT writes it once,
after all its services: ``batch()``), so they survive an agent
restart as the pinned maps do: a late PUT of an older generation that arrives while the agent
restarts is refused as it would be before. The maps are written first: a crash between the two
leaves the file one generation behind the maps, which the heartbeat reports and fabricd mends by
sending the newer one again (never a file ahead of maps that hold less). A file that cannot be
read is set aside (logged) and the agent starts with nothing held, as before there was a file.

What the agent holds is reported with every heartbeat (``report``): only services the dataplane
still has, so a service removed behind the API's back (the fail-closed withdrawal, the
``fabric-agent maglev`` CLI) or lost with the maps (a reboot empties bpffs; the file stays and
keeps refusing older generations) shows as missing, and fabricd sends it again. Generation 0 (a
hand PUT with no plan) is held as 0: any plan's generation replaces it.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from common.agent_api import MaglevServiceSpec, service_key
from common.errors import Conflict

log = logging.getLogger("fabric.agent.services")
GENERATIONS_FILE = "service-generations.json"


class StaleGeneration(Conflict):
    """409: the service's generation is older than the one the agent holds."""

    def __init__(self, key: str, generation: int, held: int):
        super().__init__(f"service {key}: generation {generation} is older than the generation {held} this "
                         "agent holds; a newer plan was applied already", code="stale_generation")
        self.held = held


class ServiceGenerations:
    """The generation of each service this agent wrote, and the one lock its writers share."""

    def __init__(self, path: Path | None = None) -> None:
        """``path``: the file that keeps the held generations across restarts (None: memory only)."""
        self._lock = threading.RLock()  # re-entered by put() inside batch()
        self._path = path
        self._held: dict[str, int] = _load(path) if path is not None else {}
        self._batching = False
        self._unsaved = False

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Hold the lock for several puts and deletes, and write the file once when they end (one
        fsync for a pushed batch of hundreds of services, not one rewrite of the whole file each).
        The maps are written as each put goes, so the file still never runs ahead of them."""
        with self._lock:
            if self._batching:  # nested: the outer one saves
                yield
                return
            self._batching = True
            try:
                yield
            finally:
                self._batching = False
                if self._unsaved:
                    self._save()

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
            if self._held.get(key) != spec.generation:
                self._held[key] = spec.generation
                self._save()
            return bool(changed)

    def delete(self, dataplane: Any, vip: str, port: int, proto: str) -> bool:
        """Remove the service and forget its generation (a later endpoint may reuse the VIP)."""
        with self._lock:
            removed = bool(dataplane.delete_service(vip, port, proto))
            if self._held.pop(service_key(vip, port, proto), None) is not None:
                self._save()
            return removed

    def held(self, key: str) -> int:
        with self._lock:
            return self._held.get(key, 0)

    def report(self, dataplane: Any) -> dict[str, int]:
        """Generation per service the dataplane holds now (its ``readiness`` rows: two map reads);
        a service written by hand or before a restart reports 0."""
        present = [service_key(vip, port, proto) for vip, port, proto, *_ in dataplane.readiness()]
        with self._lock:
            return {key: self._held.get(key, 0) for key in present}

    def _save(self) -> None:
        """Replace the file with what is held (under the lock): a new file, synced, renamed over;
        inside ``batch()``, when it ends."""
        if self._path is None:
            return
        if self._batching:
            self._unsaved = True
            return
        self._unsaved = False
        tmp = self._path.with_name(self._path.name + ".tmp")
        with open(tmp, "w") as f:
            json.dump({"generations": self._held}, f, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._path)


def _load(path: Path) -> dict[str, int]:
    try:
        raw = json.loads(path.read_text())
        held = raw["generations"]
        if not isinstance(held, dict) or not all(isinstance(k, str) and type(v) is int and v >= 0
                                                 for k, v in held.items()):
            raise ValueError("generations must map service keys to generations")
        return dict(held)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        aside = path.with_name(path.name + ".unreadable")
        log.warning("%s cannot be read (%s): moved to %s; no service generation held", path, exc, aside)
        try:
            os.replace(path, aside)
        except OSError:
            pass
        return {}
