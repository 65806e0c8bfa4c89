"""Lifecycle rules of the reconcile plan (pure, table-driven): removals drain, failures count
across replacements, backoff then CrashLoop, bounded waits (engine exited, model job failed,
no address past the start budget), the engine's own error line."""

import pytest

from common.schemas import DeploymentStatus
from controlplane.reconcile.crashloop import CrashLoopSettings, backoff_s, crash_state
from controlplane.reconcile.engine_failure import engine_error_line
from controlplane.reconcile.plan import (
    CreateReplica,
    DeleteReplica,
    FailReplica,
    Probe,
    ReconcileSettings,
    StartDrain,
    UpdateHealth,
    plan,
)
from tests.controlplane.planner_data import NOW, deployment, model, node, profile, replica

CL = CrashLoopSettings(park_after=3, backoff_base_s=10, backoff_cap_s=40, reset_after_s=600)
SETTINGS = ReconcileSettings(start_timeout_s=900, crashloop=CL)
HTTP_503 = Probe(False, "HTTP 503", answered=True)
REFUSED = Probe(False, "ConnectError")


def kinds(p, kind):
    return [a for a in p.actions if isinstance(a, kind)]


def run(replicas, probes=None, *, dep=None, now=NOW, **kw):
    return plan(dep or deployment(1), profile(), model(), list(replicas), [node("n1", 4), node("n2", 4)],
                probes or {}, now, settings=SETTINGS, **kw)


def failed(n, at=NOW - 1, last="qwen-0-abc: boom"):
    return deployment(1, status=DeploymentStatus(failures=n, last_failure=last, last_failure_at=at))


@pytest.mark.parametrize("probe,action", [(HTTP_503, StartDrain), (REFUSED, DeleteReplica)])
def test_third_health_failure_drains_an_answering_engine_and_deletes_a_silent_one(probe, action):
    p = run([replica(0, failures=2)], {"qwen-0-abc": probe})
    (removal,) = [a for a in p.actions if isinstance(a, (StartDrain, DeleteReplica))]
    assert isinstance(removal, action) and "3 times" in removal.reason
    assert kinds(p, CreateReplica), "the replacement starts while the old one drains"
    assert p.status.failures == 1 and "health failed 3 times" in p.status.last_failure


@pytest.mark.parametrize("failures,expected", [(0, 0), (1, 0), (2, 10), (3, 20), (4, 40), (9, 40)])
def test_backoff_grows_from_the_second_failure_and_is_capped(failures, expected):
    assert backoff_s(failures, CL) == expected


def test_backoff_holds_the_replacement_until_its_time():
    p = run([], dep=failed(2, at=NOW - 4))
    assert not kinds(p, CreateReplica)
    assert p.status.phase == "Backoff" and "next replica in 6s" in p.status.message
    assert "boom" in p.status.message and p.status.failures == 2
    p = run([], dep=failed(2, at=NOW - 11))
    assert kinds(p, CreateReplica) and p.status.phase != "Backoff"


def test_parked_after_park_after_failures_creates_nothing_and_names_the_last_reason():
    p = run([replica(0, failures=2)], {"qwen-0-abc": REFUSED}, dep=failed(2, at=NOW - 100))
    assert p.status.phase == "CrashLoop" and p.status.failures == 3
    assert not kinds(p, CreateReplica)
    assert "health failed 3 times" in p.status.message and "deployment restart qwen" in p.status.message
    again = run([], dep=failed(3, at=NOW - 10_000))
    assert again.status.phase == "CrashLoop" and not kinds(again, CreateReplica)  # waiting never unparks


def test_a_replica_ready_long_enough_after_the_last_failure_resets_the_count():
    r = replica(0).model_copy(update={"ready_since": NOW - 700})
    p = run([r], {"qwen-0-abc": Probe(True)}, dep=failed(2, at=NOW - 800))
    assert p.status.failures == 0 and p.status.phase == "Ready"
    young = replica(0).model_copy(update={"ready_since": NOW - 100})
    assert run([young], {"qwen-0-abc": Probe(True)}, dep=failed(2, at=NOW - 800)).status.failures == 2


def test_scale_in_and_deletion_are_not_failures():
    reps = [replica(0), replica(1)]
    p = run(reps, {"qwen-0-abc": Probe(True), "qwen-1-abc": Probe(True)})
    assert kinds(p, StartDrain) and p.status.failures == 0


def test_starting_within_the_budget_is_starting_not_failing():
    young = replica(0, ready=False, created=NOW - 599)  # vLLM's start budget: 600 s
    p = run([young], {"qwen-0-abc": REFUSED})
    (upd,) = kinds(p, UpdateHealth)
    assert upd.phase == "Starting" and not kinds(p, DeleteReplica) and p.status.failures == 0
    old = replica(0, ready=False, created=NOW - 601)
    p = run([old], {"qwen-0-abc": REFUSED})
    (gone,) = kinds(p, DeleteReplica)
    assert "not ready after 600s" in gone.reason and p.status.failures == 1


def test_an_engine_that_exited_is_failed_with_its_own_line_not_restarted_forever():
    line = "OSError: /models does not appear to have a file named config.json"
    p = run([replica(0, ready=False, created=NOW - 30)], {"qwen-0-abc": REFUSED}, vm_failures={"qwen-0-abc": line})
    (fail,) = kinds(p, FailReplica)
    assert fail.reason == f"engine exited: {line}"
    assert p.status.failures == 1 and line in p.status.last_failure
    # The next failures back off, then park with the engine's line in the status.
    parked = run([replica(0, ready=False, created=NOW - 30)], {"qwen-0-abc": REFUSED},
                 vm_failures={"qwen-0-abc": line}, dep=failed(2, at=NOW - 100))
    assert parked.status.phase == "CrashLoop" and line in parked.status.message


def test_a_failed_model_job_fails_the_pending_replica_and_releases_it():
    pending = replica(0, ready=False, host=None).model_copy(update={"phase": "Pending"})
    p = run([pending], model_failures={"qwen-0-abc": "gated repository: 401"})
    (fail,) = kinds(p, FailReplica)
    assert "model job failed: gated repository: 401" in fail.reason and p.status.failures == 1


def test_no_address_past_the_start_budget_is_failed_unless_a_model_job_still_runs():
    stuck = replica(0, ready=False, host=None, created=NOW - 1000).model_copy(update={"phase": "Pending"})
    (fail,) = kinds(run([stuck]), FailReplica)
    assert "no address" in fail.reason
    assert not kinds(run([stuck], model_waits={"qwen-0-abc"}), FailReplica)  # a big download is not stuck
    assert not kinds(run([stuck.model_copy(update={"created_at": NOW - 10})]), FailReplica)


def test_crash_state_keeps_the_count_between_ticks():
    st = DeploymentStatus(failures=1, last_failure="x", last_failure_at=NOW - 5)
    s = crash_state(st, ["y"], [], NOW, CL)
    assert (s.failures, s.last_failure, s.last_failure_at, s.parked, s.wait_until) == (2, "y", NOW, False, NOW + 10)


@pytest.mark.parametrize("log,line", [
    ("INFO loading\nTraceback (most recent call last):\n  File x\nOSError: no config.json\n"
     "ERROR 12-01 engine died\nRuntimeError: Engine core initialization failed. See root cause above.\n",
     "OSError: no config.json"),
    ("\x1b[31mERROR\x1b[0m CUDA out of memory\nshutting down\n", "ERROR CUDA out of memory"),
    ("just one line\n", "just one line"),
    ("huggingface_hub.errors.GatedRepoError: 401 Client Error\n", "huggingface_hub.errors.GatedRepoError: 401 Client Error"),
    ("\n\n", "the engine exited without writing a log line"),
])
def test_engine_error_line(log, line):
    assert engine_error_line(log) == line
