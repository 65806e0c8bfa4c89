"""Issue 50, medium 3: the agent keeps tenants' model roots apart itself, not only fabricd.
Each test performs the attack with the agent's real job runner, cache and manifest code:

- tenant A's root holds a symlink into tenant B's: A's job is refused (the agent resolves and
  checks the root itself), and so is a path naming B's root outright;
- a digest tenant A published from its root does not serve tenant B's replica (cache entries
  are keyed by tenant and digest; the agent's own by-digest copies serve anyone);
- A edits its files after the hash: the replica does not start on them (hashed again);
- a file swapped for a symlink after the walk is not followed (O_NOFOLLOW).
"""

from __future__ import annotations

import errno

import pytest

from common.model_manifest import CheckFailed, sha256_file
from lab.tiny_model import write_tiny_model
from tests.agent.model_support import finish, jobs_for, request


def tenant_dir(tmp_path, tenant):
    return tmp_path / "srv-models" / "tenants" / tenant


def test_a_symlink_from_one_tenants_root_into_anothers_is_refused(tmp_path):
    theirs = write_tiny_model(tenant_dir(tmp_path, "b") / "secret-model")
    tenant_dir(tmp_path, "a").mkdir(parents=True)
    (tenant_dir(tmp_path, "a") / "borrowed").symlink_to(theirs)
    jobs = jobs_for(tmp_path, "http://127.0.0.1:9")
    jobs.submit(request(str(tenant_dir(tmp_path, "a") / "borrowed"), job="link.n", tenant="a"))
    jobs.submit(request(str(theirs), job="direct.n", tenant="a"))
    link, direct = finish(jobs, "link.n"), finish(jobs, "direct.n")
    assert link.state == "Failed" and "goes through a symlink" in link.message
    assert direct.state == "Failed" and "model root of tenant a" in direct.message


def test_a_tenants_local_copy_does_not_serve_another_tenant(tmp_path):
    mine = write_tiny_model(tenant_dir(tmp_path, "a") / "m")
    jobs = jobs_for(tmp_path, "http://127.0.0.1:9")
    jobs.submit(request(str(mine), job="m.n", tenant="a"))
    view = finish(jobs, "m.n")
    assert view.state == "Ready", view.message
    cache = jobs.cache
    assert cache.path_for(view.digest, "a") is not None
    assert cache.path_for(view.digest, "b") is None and cache.path_for(view.digest) is None
    assert cache.ready_path(view.digest, "b", 100) is None  # what a VM create for tenant b asks


def test_bytes_edited_after_the_hash_do_not_start_a_replica(tmp_path):
    mine = write_tiny_model(tenant_dir(tmp_path, "a") / "m")
    jobs = jobs_for(tmp_path, "http://127.0.0.1:9")
    jobs.submit(request(str(mine), job="m.n", tenant="a"))
    view = finish(jobs, "m.n")
    assert jobs.cache.ready_path(view.digest, "a", 100) is not None
    (mine / "config.json").write_text('{"evil": true}')
    with pytest.raises(CheckFailed, match="now hashes to"):
        jobs.cache.ready_path(view.digest, "a", 100)


def test_a_file_swapped_for_a_symlink_is_not_followed(tmp_path):
    target = tmp_path / "target"
    target.write_text("not yours")
    link = tmp_path / "weights.safetensors"
    link.symlink_to(target)
    with pytest.raises(OSError) as exc:
        sha256_file(link)
    assert exc.value.errno == errno.ELOOP
