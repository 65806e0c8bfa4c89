"""The model supply chain's pure decisions: merging agent views, the replica gate, eviction,
the model's phase and the scheduler's digest-based cache preference."""

from __future__ import annotations

from common.model_api import AgentJobView, CacheEntry, ModelJob, Transition, retried
from common.schemas import ModelArtifact, ModelStatus, Node
from controlplane.models import plan
from controlplane.placement.scheduler import model_cached

D1, D2, D3, D4 = ("1" * 64), ("2" * 64), ("3" * 64), ("4" * 64)


def model(**kw) -> ModelArtifact:
    return ModelArtifact(name=kw.pop("name", "demo"), source=kw.pop("source", "hf://org/demo"), **kw)


def job(**kw) -> ModelJob:
    return ModelJob(model="demo", node="n1", history=[Transition(state="Registered", at=1.0)], **kw)


def test_merge_appends_every_state_the_agent_passed_through():
    view = AgentJobView(job_id="demo.n1", state="Verifying", message="hashing", revision="abc", bytes_done=5,
                        bytes_total=10, history=[Transition(state="Registered", at=2.0),
                                                 Transition(state="Resolving", at=3.0),
                                                 Transition(state="Downloading", at=4.0),
                                                 Transition(state="Verifying", at=5.0)])
    merged = plan.merge(job(), view, now=6.0)
    assert [t.state for t in merged.history] == ["Registered", "Resolving", "Downloading", "Verifying"]
    assert merged.state == "Verifying" and merged.revision == "abc" and merged.bytes_done == 5
    assert plan.merge(merged, view, now=7.0) is None  # nothing new: no store write
    stale = view.model_copy(update={"attempt": 3})
    assert plan.merge(merged, stale, now=7.0) is None  # an answer about another attempt


def test_merge_counts_retries_across_attempts():
    view = AgentJobView(job_id="demo.n1", attempt=2, state="Downloading", retries=1)
    merged = plan.merge(job(attempt=2), view, now=1.0)
    assert merged.retries == 3


def test_request_carries_the_commit_another_node_resolved():
    m = model(digest=D1, require_checksum=True, signature="ab" * 32, size_bytes=10)
    m = m.model_copy(update={"status": ModelStatus(revision="c0ffee")})
    req = plan.request_for(m, job())
    assert req.revision == "c0ffee" and req.expected_digest == D1 and req.require_checksum
    assert req.signature == "ab" * 32 and req.size_bytes == 10 and req.job_id == "demo.n1"


def test_gate_waits_with_progress_until_ready():
    m = model()
    none = plan.gate(m, None)
    assert not none.ready and none.record_job
    down = plan.gate(m, job(state="Downloading", bytes_done=int(3.1 * 2**30), bytes_total=int(16.4 * 2**30)))
    assert not down.ready
    assert down.message == "model demo: Downloading 3.1/16.4 GiB; watch: fabricctl ai model status demo"
    failed = plan.gate(m, job(state="Failed", message="Scanning: x.pt is a pickle file"))
    assert not failed.ready and "Failed: Scanning: x.pt" in failed.message and not failed.record_job
    assert failed.message.endswith("fetch it again: fabricctl ai model materialize demo")  # what to run
    ready = plan.gate(m, job(state="Ready", digest=D1))
    assert ready.ready and ready.digest == D1


def entry(digest, size, used, local=False) -> CacheEntry:
    return CacheEntry(digest=digest, size_bytes=size, last_used=used, path=f"/x/{digest}", local=local)


def test_eviction_is_lru_and_keeps_referenced_and_local_models():
    entries = {"n1": [entry(D1, 100, 1.0), entry(D2, 100, 2.0), entry(D3, 100, 3.0), entry(D4, 500, 0.5, local=True)]}
    result = plan.plan_eviction(entries, {D1: ["chat"]}, budget_bytes=200)
    assert [e.digest for e in result.evict] == [D2]  # least recently used first, until 200 fits
    kept = {e.digest: e.reason for e in result.kept}
    assert "model chat is named by a deployment" in kept[D1]
    assert "local source" in kept[D4]
    assert kept[D3] == "within the budget"
    assert result.over_budget == {}
    everything = plan.plan_eviction(entries, {D1: ["chat"]}, budget_bytes=0)
    assert [e.digest for e in everything.evict] == [D2, D3]
    assert everything.over_budget == {"n1": 100}  # the deployed model stays, over budget


def test_model_phase():
    assert plan.model_phase([])[0] == "Registered"
    assert plan.model_phase([job(state="Downloading", message="x")]) == ("Downloading", "n1: x")
    both = [job(state="Failed"), ModelJob(model="demo", node="n2", state="Ready", digest=D1)]
    assert plan.model_phase(both) == ("Ready", "ready on n2")


def test_scheduler_cache_preference_uses_digests():
    node = Node(id="n1", address="https://n1:9443", cached_models=[D1, "demo"])
    assert model_cached(model().model_copy(update={"status": ModelStatus(digest=D1)}), node)
    # A known digest the node lacks is not cached, whatever the names say.
    assert not model_cached(model().model_copy(update={"status": ModelStatus(digest=D2)}), node)
    assert model_cached(model(digest=D1), node)  # the expected digest counts too
    assert model_cached(model(), node)  # no digest known yet: the name (older agents)


def test_gate_notices_a_node_that_lost_the_bytes():
    m = model()
    ready = job(state="Ready", digest=D1, updated_at=100.0)
    holds = Node(id="n1", address="https://n1:9443", cached_models=[D1], last_heartbeat=200.0)
    lost = holds.model_copy(update={"cached_models": []})
    early = lost.model_copy(update={"last_heartbeat": 101.0})  # a report that may predate the Ready
    assert plan.gate(m, ready, holds).ready
    assert plan.gate(m, ready, early).ready
    gone = plan.gate(m, ready, lost)
    assert not gone.ready and gone.restart_job and "no longer holds" in gone.message
    again = retried(ready, "fetch again", now=300.0)
    assert again.state == "Registered" and again.attempt == 1 and again.retries == 1 and again.digest is None


def test_adapters_travel_with_the_job_and_gate_the_replica():
    from common.model_api import AdapterFetched
    from common.schemas import LoraAdapter

    m = model(adapters=[LoraAdapter(name="sql", source="hf://org/sql-lora", digest=D3),
                        LoraAdapter(name="poem", source="hf://org/poem-lora")],
              status=ModelStatus(phase="Ready", adapter_revisions={"poem": "c0ffee"}))
    req = plan.request_for(m, job(adapters={"sql": AdapterFetched(source="hf://org/sql-lora", digest=D3,
                                                                  revision="beef")}))
    # Each adapter at the commit already resolved: the job's own, else the one the model pinned.
    assert [(a.name, a.revision, a.expected_digest) for a in req.adapters] == [
        ("sql", "beef", D3), ("poem", "c0ffee", None)]
    moved = plan.request_for(m, job(adapters={"sql": AdapterFetched(source="hf://org/other", digest=D3,
                                                                    revision="beef")}))
    assert moved.adapters[0].revision is None  # a different source: resolved again

    view = AgentJobView(job_id="demo.n1", state="Ready", digest=D1, path="/p",
                        adapters={"sql": AdapterFetched(source="hf://org/sql-lora", digest=D3),
                                  "poem": AdapterFetched(source="hf://org/poem-lora", digest=D4)})
    ready = plan.merge(job(), view, now=5.0)
    assert {n: a.digest for n, a in ready.adapters.items()} == {"sql": D3, "poem": D4}
    g = plan.gate(m, ready)
    assert g.ready and g.digest == D1 and g.adapters == {"poem": D4, "sql": D3}
    # An adapter added to the model after the job was Ready: fetch again before any new VM.
    more = m.model_copy(update={"adapters": [*m.adapters, LoraAdapter(name="code", source="hf://org/code")]})
    changed = plan.gate(more, ready)
    assert not changed.ready and changed.restart_job and "adapters changed" in changed.message
    assert retried(ready, "adapters changed", now=6.0).adapters == {}
    assert plan.gate(model(), job(state="Ready", digest=D1)).adapters == {}  # no adapters: as before
