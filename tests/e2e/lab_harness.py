"""The e2e modules' labs: `running_lab` brings one up on fresh ports, state dir and pin dir and
takes it down (and removes it) after; `SharedLab` keeps one of them for every chapter that asks
for the `shared_lab` fixture (tests/e2e/conftest.py). Its processes' logs come with the failure
when a lab does not come up. The lab's names are fixed, so a lab holds /tmp/fabric-lab.lock
while it runs (at once when an ancestor such as `flock /tmp/fabric-lab.lock make test` holds it
already), and only one is up at a time."""

from __future__ import annotations

import shutil
import ssl
import uuid
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx

from lab.cluster import LabConfig, down, up
from lab.rigs.chaos_lab import FLOW_ENTRIES
from lab.rigs.lab_lock import lab_lock
from lab.rigs.polling import wait_for
from lab.rigs.servers import free_port


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


# The shared lab's settings serve every chapter on it: the story's small connection table (its
# chaos chapter's scan fills 4x it), and 1 s reconcile, routing and autoscaling passes (the
# no-drop and rollout chapters' pace).
SHARED_SETTINGS = {"flow_entries": FLOW_ENTRIES, "reconcile_secs": 1.0, "routing_secs": 1.0, "autoscale_secs": 1.0}
# what a chapter creates (SharedLab.reset deletes profiles and models once their deployments are gone)
KINDS = ("endpoints", "deployments", "keys", "profiles", "models")


class SharedLab:
    """One lab for the story, no-drop and rollout chapters. `get` brings it up on first use;
    afterwards it first deletes what earlier chapters left (whatever was not there right after
    `up`) and waits until their replicas and Maglev services are gone, so each chapter starts
    on what a fresh lab holds, whichever ran before it; where that fails (a chapter left the lab
    broken) it brings up a new one. `close` takes it down (again, when a chapter took it down
    itself); the next `get` then brings up a new one."""

    def __init__(self) -> None:
        self._stack: ExitStack | None = None
        self.cfg: LabConfig | None = None
        self.token = ""
        self._baseline: dict[str, set[str]] = {}

    @property
    def is_up(self) -> bool:
        return self._stack is not None

    def get(self) -> tuple[LabConfig, str]:
        if self._stack is not None:
            try:
                self.reset()
            except (AssertionError, httpx.HTTPError) as exc:  # a chapter left it broken: start over
                print(f"shared lab: reset failed ({exc}); bringing up a new one")
                self.close()
        if self._stack is None or self.cfg is None:
            stack = ExitStack()
            cfg, handle = stack.enter_context(running_lab("e2e", **SHARED_SETTINGS))
            self._stack, self.cfg, self.token = stack, cfg, handle.token
            with self._api() as api:
                self._baseline = {kind: set(self._names(api, kind)) for kind in KINDS}
        return self.cfg, self.token

    def _api(self) -> httpx.Client:
        assert self.cfg is not None
        return httpx.Client(base_url=self.cfg.url, verify=ssl.create_default_context(cafile=str(self.cfg.ca)),
                            timeout=15, headers={"Authorization": f"Bearer {self.token}"})

    @staticmethod
    def _names(api: httpx.Client, kind: str) -> list[str]:
        r = api.get(f"/api/ai/{kind}")
        r.raise_for_status()
        return [item["id"] if kind == "keys" else item["name"] for item in r.json()]

    def reset(self) -> None:
        """Delete what chapters made since `up` (the endpoints and deployments at once, so they
        drain at the same time); wait for the deployments, their replicas and the endpoints' Maglev
        services to be gone (their GPUs and VIPs free again)."""
        assert self.cfg is not None
        with self._api() as api:
            made = {kind: set(self._names(api, kind)) - self._baseline.get(kind, set()) for kind in KINDS}

            def delete(kinds: tuple[str, ...]) -> None:
                for kind in kinds:
                    for name in made[kind]:
                        r = api.delete(f"/api/ai/{kind}/{name}")
                        assert r.status_code in (200, 202, 204, 404), (kind, name, r.status_code, r.text)

            delete(("endpoints", "deployments", "keys"))
            wait_for(lambda: not any(api.get(f"/api/ai/{kind}/{name}").status_code != 404
                                     for kind in ("endpoints", "deployments") for name in made[kind]),
                     120, f"{sorted(made['endpoints'] | made['deployments'])} gone before the next chapter")
            wait_for(lambda: api.get("/api/ai/replicas").json() == [], 120, "no replicas left")
            delete(("profiles", "models"))  # in use until their deployments are gone
        agent_ctx = ssl.create_default_context(cafile=str(self.cfg.ca))
        pki = self.cfg.fabricd_dir / "pki"
        agent_ctx.load_cert_chain(str(pki / "fabricd.crt"), str(pki / "fabricd.key"))
        with httpx.Client(base_url=f"https://127.0.0.1:{self.cfg.agent_port}", verify=agent_ctx, timeout=15) as agent:
            wait_for(lambda: agent.get("/v1/maglev/services").json()["services"] == [], 60, "no Maglev services left")

    def close(self) -> None:
        stack, self._stack, self.cfg, self._baseline = self._stack, None, None, {}
        if stack is not None:
            stack.close()
