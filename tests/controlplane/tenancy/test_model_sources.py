"""A tenant-bound caller registers only its own weights (issue 40): local sources under its own
model root ({FABRIC_MODEL_DIR}/tenants/T/), hf:// sources only from repositories its policy
allows, since the node fetches with its own access (the whole root, its one HF token)."""

from __future__ import annotations

import pytest

from common.store.connect import open_store
from controlplane.auth import ensure_token_secret, issue_token
from controlplane.tenancy.model_sources import refusal

ROOT = "/srv/models"  # the tenancy fabricd's FABRIC_MODEL_DIR (the default)


@pytest.fixture(scope="module")
def ops(tenancy_fabricd) -> dict[str, str]:
    store = open_store(None, tenancy_fabricd.state_dir)
    try:
        secret = ensure_token_secret(store)
    finally:
        store.close()
    return {t: issue_token(secret, f"ops-{t}", 600, role="operator", tenant=t)[0] for t in ("src-a", "src-b")}


def _refused(resp) -> None:
    assert resp.status_code == 403, resp.text
    assert resp.json()["error"]["code"] == "source_not_allowed"


def test_tenant_a_is_refused_tenant_bs_local_source(tenancy_fabricd, tokens, ops):
    with tenancy_fabricd.client(ops["src-a"]) as a, tenancy_fabricd.client(tokens["admin"]) as admin:
        _refused(a.post("/api/ai/models", json={"name": "steal-b", "source": f"{ROOT}/tenants/src-b/fine-tune"}))
        _refused(a.post("/api/ai/models", json={"name": "shared-path", "source": f"{ROOT}/llama"}))
        _refused(a.post("/api/ai/models", json={"name": "dots", "source": f"{ROOT}/tenants/src-a/../src-b/x"}))
        _refused(a.post("/api/ai/models", json={"name": "adapter-b", "source": f"{ROOT}/tenants/src-a/base",
                                                 "adapters": [{"name": "ft", "source": f"file://{ROOT}/tenants/src-b/ft"}]}))
        own = a.post("/api/ai/models", json={"name": "own-a", "source": f"{ROOT}/tenants/src-a/fine-tune"})
        assert own.status_code == 201 and own.json()["tenant"] == "src-a", own.text
        # An admin (cluster-wide) keeps the whole root, for any tenant.
        made = admin.post("/api/ai/models", json={"name": "b-by-admin", "tenant": "src-b",
                                                  "source": f"{ROOT}/tenants/src-b/fine-tune"})
        assert made.status_code == 201, made.text


def test_hf_sources_need_the_tenants_allow_list(tenancy_fabricd, tokens, ops):
    with tenancy_fabricd.client(ops["src-b"]) as b, tenancy_fabricd.client(tokens["admin"]) as admin:
        _refused(b.post("/api/ai/models", json={"name": "hf-none", "source": "hf://other-team/private"}))
        assert admin.post("/api/ai/policies", json={"tenant": "src-b", "allowed_source_prefixes": [
            "hf://team-b/", f"{ROOT}/tenants/src-b/"]}).status_code == 201
        _refused(b.post("/api/ai/models", json={"name": "hf-other", "source": "hf://other-team/private"}))
        ok = b.post("/api/ai/models", json={"name": "hf-own", "source": "hf://team-b/tuned"})
        assert ok.status_code == 201, ok.text


def test_refusal_is_pure_and_names_no_other_tenants_path():
    assert refusal(f"{ROOT}/tenants/t/x", "t", ROOT, None) is None
    why = refusal(f"{ROOT}/tenants/u/x", "t", ROOT, None)
    assert why and "/tenants/u" not in why
    assert refusal("hf://org/m", "t", ROOT, ["hf://org/"]) is None
    assert refusal("hf://orgx/m", "t", ROOT, ["hf://org/"])
    assert refusal("hf://org/m", "t", ROOT, ["/srv/models/"])  # a local prefix allows no hf:// repository


def test_an_allow_list_entry_admits_whole_segments_and_no_pull_request_revision(tenancy_fabricd, tokens, ops):
    """The attacks (issue 50, Low): ``hf://team-a`` admitted ``hf://team-a-evil/...`` (a repository
    anyone may name so), and ``@refs/pr/N`` (a pull request anyone may open) was accepted."""
    with tenancy_fabricd.client(ops["src-a"]) as a, tenancy_fabricd.client(tokens["admin"]) as admin:
        policy = {"tenant": "src-a", "allowed_source_prefixes": ["hf://team-a", f"{ROOT}/tenants/src-a/"]}
        assert admin.post("/api/ai/policies", json=policy).status_code == 201
        _refused(a.post("/api/ai/models", json={"name": "evil-twin", "source": "hf://team-a-evil/weights"}))
        _refused(a.post("/api/ai/models", json={"name": "pr-rev", "source": "hf://team-a/tuned@refs/pr/7"}))
        ok = a.post("/api/ai/models", json={"name": "team-a-tuned", "source": "hf://team-a/tuned@main"})
        assert ok.status_code == 201, ok.text
        allowed = admin.post("/api/ai/policies", json={**policy, "allow_pr_revisions": True})
        assert allowed.status_code == 201, allowed.text
        pr = a.post("/api/ai/models", json={"name": "pr-rev", "source": "hf://team-a/tuned@refs/pr/7"})
        assert pr.status_code == 201, pr.text


def test_source_under_matches_whole_segments():
    from controlplane.tenancy.policies import source_under

    assert source_under("hf://team-a/m", "hf://team-a") and source_under("hf://team-a/m", "hf://team-a/")
    assert source_under("hf://team-a/m@v1", "hf://team-a/m") and source_under("hf://team-a", "hf://team-a")
    assert not source_under("hf://team-a-evil/m", "hf://team-a")
    assert not source_under("hf://team-a/model-x", "hf://team-a/model")
    assert not source_under("/srv/models/tenants/a-evil/x", "/srv/models/tenants/a")
    assert refusal("hf://org/m@refs/pr/1", "t", ROOT, ["hf://org"])
    assert refusal("hf://org/m@refs/pr/1", "t", ROOT, ["hf://org"], allow_pr_revisions=True) is None
