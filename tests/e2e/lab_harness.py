"""One lab for an e2e module: up on fresh ports, state dir and pin dir, down (and removed) after.
Its processes' logs come with the failure when it does not come up. The lab's names are fixed,
so it holds /tmp/fabric-lab.lock while it runs (at once when an ancestor such as
`flock /tmp/fabric-lab.lock make test` holds it already)."""

from __future__ import annotations

import shutil
import uuid
from contextlib import contextmanager
from pathlib import Path

from controlplane.lab.cluster import LabConfig, down, up
from tests.support.lab_lock import lab_lock
from tests.support.servers import free_port


@contextmanager
def running_lab(tag: str, **settings):
    """(LabConfig, the handle `up` returned); ``settings`` go to LabConfig."""
    base = Path("/tmp") / f"fabric-{tag}-{uuid.uuid4().hex[:6]}"
    cfg = LabConfig(state_dir=base, api_port=free_port(), agent_port=free_port(), gateway_port=free_port(),
                    mirror_port=free_port(), pin_dir=Path(f"/sys/fs/bpf/fabric-{tag}-{uuid.uuid4().hex[:6]}"), **settings)
    with lab_lock():
        try:
            handle = up(cfg, echo=lambda *_: None)
        except Exception:  # noqa: BLE001 - whatever broke, show the processes' logs with the failure
            logs = "".join(f"\n--- {p.name}\n{p.read_text()[-3000:]}" for p in (base / "logs").glob("*.log"))
            down(cfg)
            raise AssertionError(f"lab did not come up{logs}") from None
        try:
            yield cfg, handle
        finally:
            down(cfg)
            shutil.rmtree(base, ignore_errors=True)
