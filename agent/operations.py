"""Long agent operations: GPU bind and release, VM create and delete take as long as the hardware
(a VFIO bind waits for the GPU's driver to let go; QEMU pins every page of guest memory before a
create returns; a delete waits for the guest to stop), so the API never holds a request open
for them.

The verb checks its input and answers 202 with an ``AgentOperation`` at once; the work runs on
its own thread (under the agent's one driver lock, as the synchronous handlers did), and
``GET /v1/operations/{id}`` reads its state: ``running``, then ``succeeded`` with its result or
``failed`` with the status, code and message the synchronous call would have answered.

Invariants:
  - One running operation per (kind, target): a second start of the same kind for the same GPU
    or replica returns the running one, so fabricd's retry after its own deadline joins the
    work instead of starting it twice.
  - Finished operations are kept (the last ``keep``) for fabricd to read their result; running
    ones are never dropped. Records live in memory: after an agent restart the id is unknown
    (404), fabricd starts the verb again, and the drivers' own idempotency (create of an existing
    replica returns it, delete of an absent one says so) makes that safe.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from common.agent_api import AgentOperation, OperationError, OperationKind
from common.errors import FabricError

log = logging.getLogger("fabric-agent.operations")

Work = Callable[[], dict[str, Any]]  # returns the result fields of AgentOperation (gpu=..., vm=...)


class Operations:
    def __init__(self, *, keep: int = 512, clock: Callable[[], float] = time.time):
        self.keep = keep
        self.clock = clock
        self._mu = threading.Lock()
        self._ops: OrderedDict[str, AgentOperation] = OrderedDict()
        self._running: dict[tuple[str, str], str] = {}
        self._ids = itertools.count(1)
        self._boot = f"{int(clock() * 1000):x}"  # ids of an earlier agent process never come back

    def start(self, kind: OperationKind, target: str, work: Work) -> AgentOperation:
        """Start ``work`` on its own thread, or return the running operation of the same kind
        and target."""
        with self._mu:
            running = self._running.get((kind, target))
            if running is not None:
                return self._ops[running].model_copy()
            op = AgentOperation(id=f"{kind}-{self._boot}-{next(self._ids)}", kind=kind, target=target,
                                started_at=self.clock())
            self._ops[op.id] = op
            self._running[(kind, target)] = op.id
            self._trim()
            view = op.model_copy()
        threading.Thread(target=self._run, args=(op.id, work), name=f"op-{op.id}", daemon=True).start()
        return view

    def get(self, op_id: str) -> AgentOperation | None:
        with self._mu:
            op = self._ops.get(op_id)
            return None if op is None else op.model_copy()

    def _run(self, op_id: str, work: Work) -> None:
        fields: dict[str, Any] = {}
        try:
            fields = {**work(), "state": "succeeded"}
        except FabricError as exc:
            fields = {"state": "failed", "error": OperationError(status=exc.status, code=exc.code,
                                                                 message=exc.message)}
        except Exception as exc:  # noqa: BLE001 - the operation's reader gets the failure, as a 500 would say
            log.exception("operation %s failed", op_id)
            fields = {"state": "failed", "error": OperationError(
                status=500, code="internal", message=f"{type(exc).__name__}: {exc}")}
        with self._mu:
            op = self._ops.get(op_id)
            if op is None:  # the records were dropped under it (a test standing in for a restart)
                return
            done = op.model_copy(update={**fields, "finished_at": self.clock()})
            self._ops[op_id] = done
            self._running.pop((op.kind, op.target), None)
        log.info("operation %s (%s %s): %s%s", op_id, op.kind, op.target, done.state,
                 f": {done.error.message}" if done.error else "")

    def _trim(self) -> None:
        finished = [i for i, op in self._ops.items() if op.state != "running"]
        for op_id in finished[:max(0, len(self._ops) - self.keep)]:
            del self._ops[op_id]
