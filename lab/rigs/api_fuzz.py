"""schemathesis against fabricd's and the agent's OpenAPI: shared by tests/controlplane/test_api_fuzz.py
(a bounded profile in `make test`) and scripts/fuzz-api (a longer one, JSON summary).

Each pass runs the real `st run` CLI (the maintained OpenAPI fuzzer: coverage, fuzzing and
stateful phases, the stateful one following the links fabricd's document declares) against a
real server on loopback, and reads its JSON and NDJSON reports back into a ``Summary``: requests
sent, answers per status, failures per check. Passes:

  fabricd, authenticated   a bearer token; every check that the API's contract decides
  fabricd, unauthenticated no credentials; the hook check ``unauthenticated_is_401`` (tests/support/
                           api_fuzz_hooks.py) adds: every documented call of a secured operation
                           answers 401 with the error shape
  agent, authenticated     the control plane's client certificate (CN fabricd) over mutual TLS
  agent, other node        a node's certificate (same CA, CN not allowed): every call 403
                           caller_not_allowed (the agent's callers are certificates, not tokens: a
                           client without one never gets past the TLS handshake)

Checks left out, and why: ``positive_data_acceptance`` (fabricd refuses schema-valid values for
rules no OpenAPI schema can state: cross-field rules, names that must exist, enums read from the
store) and ``object_level_authorization`` (one admin account; no per-object owners to confuse).
"""

from __future__ import annotations

import base64
import collections
import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from common.pki import client_ssl_context

ROOT = Path(__file__).resolve().parents[2]
ST = Path(sys.executable).with_name("st")
CHECKS = ("not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,"
          "response_schema_conformance,negative_data_rejection,missing_required_header,unsupported_method,"
          "allow_header_conformance,use_after_free,ensure_resource_availability,ignored_auth")
UNAUTH_CHECKS = ("not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,"
                 "expected_refusal")
# /watch long-polls (each call waits for a change); /restore replaces the whole store, the admin's
# token secret included, which would end the run rather than test anything further.
FABRICD_EXCLUDE = r"/api/ai/watch/|/api/ai/restore$"


@dataclass(frozen=True)
class Profile:
    max_examples: int
    phases: str = "coverage,fuzzing,stateful"
    seed: int = 20
    max_time: int | None = None  # seconds for the whole pass (st --max-time)


# make test: a few cases per operation, the stateful phase following the links; the passes that
# only expect refusals need fewer (every call of them is refused the same way).
BOUNDED = Profile(max_examples=2, phases="fuzzing,stateful")
BOUNDED_REFUSALS = Profile(max_examples=1, phases="fuzzing")
LONG = Profile(max_examples=60)


@dataclass
class Summary:
    name: str
    requests: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    operations_tested: int = 0
    failures: list[dict] = field(default_factory=list)  # {"code", "title", "count", "operations"}
    errors: list[str] = field(default_factory=list)
    exit_code: int = 0
    running_time_s: float = 0.0

    @property
    def server_errors(self) -> int:
        return sum(n for s, n in self.statuses.items() if s.startswith("5"))

    def as_dict(self) -> dict:
        return {**asdict(self), "server_errors": self.server_errors}


def _interactions(ndjson: Path):
    for line in ndjson.read_text().splitlines():
        event = json.loads(line)
        finished = event.get("ScenarioFinished")
        if finished:
            yield from (finished.get("recorder") or {}).get("interactions", {}).values()


def _body(response: dict) -> str:
    content = response.get("content") or {}
    if "$base64" in content:
        return base64.b64decode(content["$base64"]).decode("utf-8", "replace")
    return str(content.get("string", ""))


def run_pass(name: str, schema: str, report_dir: Path, profile: Profile, *, headers: dict[str, str] | None = None,
             checks: str = CHECKS, exclude: str | None = None, tls_verify: str | None = None,
             cert: tuple[Path, Path] | None = None, expect_401: bool = False, expect_403: bool = False,
             base_url: str | None = None) -> Summary:
    """One `st run` pass (schema: a URL, or a file with base_url); its Summary (the reports stay
    in report_dir)."""
    report_dir.mkdir(parents=True, exist_ok=True)
    cmd = [str(ST), "run", schema, "--checks", checks, "--max-examples", str(profile.max_examples),
           "--phases", profile.phases, "--generation-deterministic", "--seed", str(profile.seed),
           "--workers", "1", "--request-timeout", "20", "--no-color", "--output-truncate", "true",
           "--report", "json,ndjson", "--report-dir", str(report_dir),
           "--report-json-path", str(report_dir / "report.json"),
           "--report-ndjson-path", str(report_dir / "events.ndjson")]
    for key, value in (headers or {}).items():
        cmd += ["-H", f"{key}: {value}"]
    if base_url:
        cmd += ["--url", base_url]
    if exclude:
        cmd += ["--exclude-path-regex", exclude]
    if tls_verify:
        cmd += ["--tls-verify", tls_verify]
    if cert:
        cmd += ["--request-cert", str(cert[0]), "--request-cert-key", str(cert[1])]
    if profile.max_time:
        cmd += ["--max-time", str(profile.max_time)]
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "lab.rigs.api_fuzz_hooks",
           "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "FABRIC_FUZZ_EXPECT": "401" if expect_401 else "403" if expect_403 else ""}
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=report_dir, env=env, capture_output=True, text=True)
    (report_dir / "st.log").write_text(proc.stdout + proc.stderr)
    summary = Summary(name, exit_code=proc.returncode, running_time_s=round(time.monotonic() - started, 1))
    report = report_dir / "report.json"
    if not report.exists():
        summary.errors.append(f"st exited {proc.returncode} without a report: {(proc.stdout + proc.stderr)[-1500:]}")
        return summary
    data = json.loads(report.read_text())
    summary.operations_tested = (data.get("operations") or {}).get("tested", 0)
    summary.failures = [{k: f[k] for k in ("code", "title", "count", "operations")} for f in data.get("failures", [])]
    summary.errors = [json.dumps(e)[:500] for e in data.get("errors", [])]
    statuses: collections.Counter = collections.Counter()
    for interaction in _interactions(report_dir / "events.ndjson"):
        response = interaction.get("response")
        statuses[str(response["status_code"]) if response else "no-response"] += 1
        if response and response["status_code"] >= 500:
            summary.errors.append(f"{interaction['request']['method']} {interaction['request']['uri']}: "
                                  f"{response['status_code']} {_body(response)[:300]}")
    summary.statuses = dict(sorted(statuses.items()))
    summary.requests = sum(statuses.values())
    return summary


# -- servers ---------------------------------------------------------------------------------------

@contextmanager
def fabricd_over_tls(tmp: Path):
    """A real fabricd (SQLite store, TLS on loopback, controllers off) and an admin token."""
    from tests.controlplane.conftest import login, start_fabricd

    with start_fabricd(tmp, insecure=False, env={"FABRIC_DENY_RUNTIMES": "triton"}) as server:
        yield server, login(server)


@contextmanager
def agent_over_mtls(tmp: Path):
    """The agent's real app over mutual TLS on loopback: fake NVML and sysfs GPUs (absent
    hardware), the dry-run driver with /bin/true as its engine (a VM create starts a real process
    that ends at once, so a fuzzer's hundreds of creates cost nothing), an in-memory dataplane.
    Yields (url, ca, fabricd's client cert, a node's client cert)."""
    import ssl

    from agent.api import create_app
    from agent.hw.gpu_inventory import NvmlInventory
    from agent.hw.nvml_fake import FakeNvml, make_gpus
    from agent.hw.sysfs_fake import FakeSysfs
    from agent.hw.vfio import VfioBinder
    from agent.state import AgentState
    from agent.vm.dryrun_driver import DryRunDriver
    from common.peer_cert import PeerCertH11Protocol
    from common.pki import ensure_ca, issue_cert
    from lab.rigs.memory_dataplane import MemoryDataplane
    from lab.rigs.servers import serve_in_thread

    pki = tmp / "pki"
    ca, _ = ensure_ca(pki)
    crt, key = issue_cert(pki, "node-fuzz", server=True, client=True, role="node", hosts=["127.0.0.1", "localhost"])
    control = issue_cert(pki, "fabricd", server=False, client=True, role="fabricd")
    node = issue_cert(pki, "node-other", server=False, client=True, role="node")
    inventory = NvmlInventory(nvml_module=FakeNvml(gpus=make_gpus(2, "h100")))
    fake = FakeSysfs(tmp / "sysfs")
    for i, gpu in enumerate(inventory.read().gpus):
        fake.add_gpu(gpu.pci, group=30 + i, audio=True, sriov_total=4)
    driver = DryRunDriver(tmp / "dry-run", engine_command=["/bin/true"])
    state = AgentState(node_id="node-fuzz", vm_driver=driver, inventory=inventory,
                       binder=VfioBinder(fake.root, kernel=fake.kernel), dataplane=MemoryDataplane())
    tls = {"ssl_certfile": str(crt), "ssl_keyfile": str(key), "ssl_ca_certs": str(ca),
           "ssl_cert_reqs": int(ssl.CERT_REQUIRED), "http": PeerCertH11Protocol}
    try:
        with serve_in_thread(create_app(state), **tls) as port:
            yield f"https://127.0.0.1:{port}", ca, control, node
    finally:
        for vm in driver.list():
            driver.delete(vm.id)


def fuzz_all(tmp: Path, profile: Profile, refusals: Profile | None = None) -> list[Summary]:
    """Every pass against fresh servers (the refusal-only passes with ``refusals``, default
    ``profile``); the summaries in order."""
    refusals = refusals or profile
    out = []
    with fabricd_over_tls(tmp / "fabricd") as (server, token):
        schema, ca = f"{server.url}/openapi.json", str(server.ca)
        out.append(run_pass("fabricd authenticated", schema, tmp / "r-fabricd", profile, exclude=FABRICD_EXCLUDE,
                            headers={"Authorization": f"Bearer {token}"}, tls_verify=ca))
        out.append(run_pass("fabricd unauthenticated", schema, tmp / "r-fabricd-anon", refusals,
                            exclude=FABRICD_EXCLUDE, checks=UNAUTH_CHECKS, tls_verify=ca, expect_401=True))
    with agent_over_mtls(tmp / "agent") as (url, ca, control, node):
        # The document itself is behind the same certificate check: fetched as the control plane.
        schema = tmp / "agent-openapi.json"
        with httpx.Client(verify=client_ssl_context(ca, *control), timeout=10) as client:
            schema.write_text(client.get(f"{url}/openapi.json").raise_for_status().text)
        out.append(run_pass("agent authenticated", str(schema), tmp / "r-agent", profile, tls_verify=str(ca),
                            cert=control, checks=CHECKS.replace(",ignored_auth", ""), base_url=url))
        out.append(run_pass("agent other node", str(schema), tmp / "r-agent-node", refusals, tls_verify=str(ca),
                            cert=node, checks=UNAUTH_CHECKS, expect_403=True, base_url=url))
    return out
