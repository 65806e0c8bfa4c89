"""Shared pieces for gateway tests: a real `fabric-gateway` child process on loopback, the
store records that point an endpoint at a real `fabric-engine-sim`, and key creation."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from common import apikeys, keyspace
from common.records import counters
from common.schemas import EndpointStatus, InferenceEndpoint, Replica
from common.store.base import Store
from common.store.connect import open_store
from enginesim.process import EngineProcess, PortTaken, bind_failed, on_free_port
from lab.rigs.polling import wait_for
from lab.rigs.routing_plans import publish_plans
from tests.support.fake_clock import SUITE_CLOCK

HMAC_SECRET = "gateway-test-hmac-secret"
# Every gateway's limit windows read the suite's one fake clock (tests/support/fake_clock.py).
BASE_ENV = {"FABRIC_KEY_HMAC_SECRET": HMAC_SECRET, "FABRIC_GATEWAY_CLOCK_FILE": str(SUITE_CLOCK.path)}
# `pytest --gateway-fallbacks` (tests/conftest.py) runs every gateway these tests start on the two
# fallbacks: aiohttp's upstream client and uvicorn's own HTTP protocol (scripts/test-gateway-fallbacks).
FALLBACKS = {"FABRIC_GATEWAY_UPSTREAM_CLIENT": "aiohttp", "FABRIC_GATEWAY_HTTP_SERVER": "uvicorn"}
FALLBACK_ENV: dict[str, str] = {}


@dataclass
class GatewayProcess:
    proc: subprocess.Popen
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def openai_base(self, endpoint: str) -> str:
        return f"{self.url}/api/ai/openai/{endpoint}/v1"

    @classmethod
    def start(cls, state_dir: Path, store_url: str, env: dict[str, str] | None = None,
              gateway_id: str = "gw-test", args: list[str] | None = None,
              port: int | None = None) -> GatewayProcess:
        if not port:
            return on_free_port(lambda p: cls.start(state_dir, store_url, env, gateway_id, args, p))
        log_path = state_dir / f"gateway-{port}.log"
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("FABRIC_")}
        full_env.update(BASE_ENV)
        full_env.update(FALLBACK_ENV)
        full_env.update(env or {})
        cmd = [sys.executable, "-m", "gateway.cli", "serve", "--state-dir", str(state_dir), "--store", store_url,
               "--listen", f"127.0.0.1:{port}", "--insecure", "--gateway-id", gateway_id, "--log-level", "info",
               *(args or [])]
        with open(log_path, "ab") as log:  # the child keeps its own copy of the descriptor
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=full_env,
                                    cwd=str(Path(__file__).resolve().parents[2]))
        gw = cls(proc, port, log_path)
        def started() -> bool:
            if proc.poll() is not None:
                log = gw.log_text()[-2000:]
                raise (PortTaken if bind_failed(log) else RuntimeError)(f"gateway exited: {log}")
            try:
                # One worker: uvicorn binds after start-up and logs "running on" once bound; until
                # then a /health answer can come from another process holding the port (this one
                # then exits). With --workers the supervisor binds before anything starts.
                bound = "--workers" in (args or []) or "Uvicorn running on" in gw.log_text()
                return bound and httpx.get(gw.url + "/health", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        try:
            wait_for(started, 30, f"the gateway on port {port} to start", interval=0.05)
        except AssertionError:
            gw.stop()
            raise
        return gw

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


def sim_engine(*extra: str, tokens_per_s: int = 0) -> EngineProcess:
    """A fabric-engine-sim serving model sim-m with instant prefill (tokens_per_s 0: instant decode too)."""
    return EngineProcess.start(["--model", "sim-m", "--tokens-per-s", str(tokens_per_s), "--prefill-tokens-per-s", "0",
                                *extra])


@contextmanager
def gateway_over(state: Path, url: str, store: Store, engines: list[EngineProcess],
                 env: dict[str, str] | None = None) -> Iterator[GatewayProcess]:
    """A gateway on the store; on exit it, the engines and the store are stopped (also when
    setting up before the yield failed)."""
    try:
        gw = GatewayProcess.start(state, url, env=env)
        try:
            yield gw
        finally:
            gw.stop()
    finally:
        for e in engines:
            e.stop()
        store.close()


def tpm_used(store: Store, key_id: str) -> int:
    """The key's tokens in the current minute window of the suite's clock."""
    return counters.window_read(store, keyspace.counters(f"tpm/key/{key_id}"), 60, SUITE_CLOCK.now)


def sqlite_state(tmp_path_factory, name: str) -> tuple[Path, str, Store]:
    """A fresh state directory, the sqlite store URL in it, and that store opened."""
    state = tmp_path_factory.mktemp(name)
    url = f"sqlite://{state}/fabric.db"
    return state, url, open_store(url)


def publish_endpoint(store: Store, name: str, engines: list[EngineProcess], deployment: str | None = None) -> None:
    deployment = deployment or f"{name}-dep"
    ep = InferenceEndpoint(name=name, deployment=deployment, status=EndpointStatus(phase="Ready"))
    store.put(keyspace.endpoints(name), ep.model_dump_json())
    for i, engine in enumerate(engines):
        rid = f"{deployment}-{i}"
        rep = Replica(replica_id=rid, deployment=deployment, ordinal=i, node="n1", host=engine.host,
                      port=engine.port, phase="Ready", ready=True)
        store.put(keyspace.replicas(deployment, rid), rep.model_dump_json())
    publish_plans(store)  # the routing controller's plan: what the gateway routes on


def make_key(store: Store, endpoint: str, **fields) -> tuple[str, str]:
    """Returns (key id, plaintext). Key names are unique per endpoint, so the default is a fresh one."""
    name = fields.pop("name", None) or f"k-{uuid.uuid4().hex[:8]}"
    record, plaintext = apikeys.create_key(store, apikeys.KeySpec(name=name, endpoint=endpoint, **fields),
                                           HMAC_SECRET.encode())
    return record.id, plaintext


def engine_running(engine: EngineProcess) -> float:
    """vllm:num_requests_running + waiting as the engine reports it now."""
    text = httpx.get(engine.url + "/metrics", timeout=5).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting")):
            total += float(line.rsplit(" ", 1)[1])
    return total
