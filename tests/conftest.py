"""Suite-wide rule: a skip is a failure unless its reason is on a short allow-list.

`make setup` installs every tool the tests use, so on the standard machine the only skips
left are for hardware that is truly absent (a GPU, /dev/kvm). Any other skip (a missing
binary, a package not installed, root not available) fails the run, so a test cannot pass
quietly on a machine where it never ran. A module skipped while it is collected (a module-level
`pytest.importorskip`) is counted by the same rule as a test skipped while it runs. The allowed skips are listed at the end of the run.

FABRIC_TEST_ALLOW_SKIPS=1 turns the rule off for a developer machine that is not the
standard one (the skips are still listed); CI never sets it.
"""

from __future__ import annotations

import os
import re
import subprocess

import pytest
from hypothesis import settings as hypothesis_settings

# Property tests draw the same examples on every run (derandomize: seeded from each test's source),
# keep no example database between runs, and have no per-example deadline (a 2-core CI machine is
# slow by moments; tests assert behaviour, never time). `pytest --hypothesis-profile default`
# explores randomly on a developer machine.
hypothesis_settings.register_profile("fabric", derandomize=True, database=None, deadline=None)
hypothesis_settings.load_profile("fabric")

# reason label -> what a skip reason must match to be allowed
ALLOWED_SKIPS: dict[str, re.Pattern[str]] = {
    "no GPU": re.compile(r"\b(GPU|NVIDIA|NVML)\b", re.IGNORECASE),
    "no KVM": re.compile(r"\bKVM\b|/dev/kvm", re.IGNORECASE),
}
OPT_OUT_ENV = "FABRIC_TEST_ALLOW_SKIPS"

pytest_plugins = ["pytester"]

_skips: list[tuple[str, str, str | None]] = []  # (nodeid, reason, allowed label or None)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--gateway-fallbacks", action="store_true",
                     help="start every test gateway on aiohttp's upstream client and uvicorn's HTTP protocol")


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")  # a pytest-xdist worker (make test runs two)


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--gateway-fallbacks"):
        from tests.gateway import gateway_harness

        gateway_harness.FALLBACK_ENV.update(gateway_harness.FALLBACKS)
    # the host-wide guard route: added once by the process that runs the session (the controller
    # under xdist), so no worker removes it while another still runs
    config.stash[_GUARD_ADDED] = not _is_worker(config) and _guard_route("add")


def pytest_unconfigure(config: pytest.Config) -> None:
    if config.stash.get(_GUARD_ADDED, False):
        _guard_route("del")


# Under pytest-xdist (`make test`: -n 2) a file's tests stay on one worker, in file order, so
# module fixtures come up once. The lab's names are fixed (one lab per host at a time), so every
# module that brings a lab up (tests/e2e, and the lab-state CLI tests) forms one unit of work,
# collected first so the longest unit starts at once. (xdist's own `--dist loadgroup` reads its
# groups from a node id attribute pytest 9 no longer has, so the scheduler below groups instead.)
LAB_GROUP = "lab"
LAB_MODULES = ("tests/e2e/", "tests/controlplane/test_lab_state.py")


def xdist_group_of(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    return LAB_GROUP if path.startswith(LAB_MODULES) else path


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _is_worker(config):  # under xdist only the workers collect; the scheduler takes their order
        lab = [i for i in items if xdist_group_of(i.nodeid) == LAB_GROUP]
        items[:] = lab + [i for i in items if xdist_group_of(i.nodeid) != LAB_GROUP]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):
        """Whole units by xdist_group_of, handed out in collection order (the lab first)."""

        def _split_scope(self, nodeid: str) -> str:
            return xdist_group_of(nodeid)

    config.option.loadscopereorder = False
    return ByGroup(config, log)


def pytest_report_header(config: pytest.Config) -> str | None:
    return "gateways on the fallbacks: aiohttp upstream client, uvicorn HTTP" \
        if config.getoption("--gateway-fallbacks") else None


# fabricd's default VIP pool (controlplane.placement.vip_pool.DEFAULT_SERVICE_CIDR). A gateway or client in a
# test that dials a VIP no namespace of the test serves would otherwise follow the host's default
# route off the machine; an `unreachable` route (a high metric, so the lab's more specific routes
# still win) makes such a dial fail at once, on this host. Removed at the end when this run added it.
GUARDED_CIDR = "10.96.0.0/16"
GUARD_METRIC = "4242"
_GUARD_ADDED = pytest.StashKey[bool]()


@pytest.fixture
def store(tmp_path):
    """A fresh SQLite store in the test's own directory (fabric.db), closed after the test. Files
    that need a seeded, shared or etcd-backed store define their own `store`, which wins."""
    from common.store.sqlite_store import SqliteStore

    s = SqliteStore(tmp_path / "fabric.db")
    yield s
    s.close()


@pytest.fixture(scope="session")
def require_bpf():
    """Skip (a failure here, see above) where the real BPF dataplane cannot run."""
    from lab.rigs.bpf import bpf_missing

    reason = bpf_missing()
    if reason:
        pytest.skip(reason)


@pytest.fixture(scope="session")
def plain_plane(require_bpf):
    """One compiled dataplane for the session, no node_ip (every backend reached without
    source NAT): the dataplane packet tables and the agent API's maps test share it
    (each compile costs 5-8 s); tests that add services there remove them."""
    from lab.rigs.bpf import shared_plane

    yield from shared_plane(None)


def _guard_route(verb: str) -> bool:
    argv = ["ip", "route", verb, "unreachable", GUARDED_CIDR, "metric", GUARD_METRIC]
    try:
        return subprocess.run(argv, capture_output=True).returncode == 0
    except FileNotFoundError:  # no iproute2: make setup installs it; the BPF tests will say so
        return False


@pytest.fixture(autouse=True)
def umask_stays_as_it_was():
    """A test that runs a CLI in-process (`fabric-agent serve` calls restrict_umask()) must not
    leave umask 077 to later tests: QEMU, as libvirt-qemu, then cannot open their files."""
    before = os.umask(0o022)
    os.umask(before)
    yield
    os.umask(before)


def allowed_label(reason: str) -> str | None:
    for label, pattern in ALLOWED_SKIPS.items():
        if pattern.search(reason):
            return label
    return None


def _reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def _count_skip(report: pytest.TestReport | pytest.CollectReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = _reason(report)
        _skips.append((report.nodeid, reason, allowed_label(reason)))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _count_skip(report)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    """A module that skips while it is collected (a module-level importorskip or
    pytest.skip(allow_module_level=True)) runs none of its tests: counted by the same rule."""
    _count_skip(report)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if os.environ.get(OPT_OUT_ENV) == "1":
        return
    quiet = (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED)
    if any(label is None for _, _, label in _skips) and session.exitstatus in quiet:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if not _skips:
        return
    tr = terminalreporter
    allowed = [s for s in _skips if s[2] is not None]
    refused = [s for s in _skips if s[2] is None]
    tr.section("skips")
    tr.write_line(f"allow-list: {', '.join(ALLOWED_SKIPS)}")
    for nodeid, reason, label in allowed:
        tr.write_line(f"allowed ({label}): {nodeid}: {reason}")
    for nodeid, reason, _ in refused:
        tr.write_line(f"NOT ALLOWED: {nodeid}: {reason}")
    if refused:
        if os.environ.get(OPT_OUT_ENV) == "1":
            tr.write_line(f"{len(refused)} skip(s) outside the allow-list ({OPT_OUT_ENV}=1: not failing)")
        else:
            tr.write_line(f"{len(refused)} skip(s) outside the allow-list fail this run: install what "
                          f"`make setup` installs, or set {OPT_OUT_ENV}=1 on a non-standard machine")
