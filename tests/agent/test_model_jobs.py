"""Agent model jobs against a real HTTP mirror and the real huggingface_hub client: every state,
every refusal, joining, the cache layout and local sources."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from agent.models.checks import build_manifest, signature_of
from lab.hf_mirror import commit_of
from lab.tiny_model import write_tiny_model
from tests.agent.model_support import REPO, finish, jobs_for, mirror, request, states


def test_hf_job_goes_through_every_state_to_a_digest_directory(tmp_path):
    with mirror(tmp_path) as m:
        jobs = jobs_for(tmp_path, m.url)
        jobs.submit(request())
        view = finish(jobs, "tiny.node-a")
    assert view.state == "Ready", view.message
    assert states(view) == ["Registered", "Resolving", "Downloading", "Verifying", "Scanning", "Ready"]
    repo_dir = tmp_path / "mirror" / REPO
    assert view.revision == commit_of(repo_dir)  # main resolved to the commit and kept
    assert view.digest == build_manifest(repo_dir).digest
    assert Path(view.path) == jobs.cache.by_digest / view.digest
    assert build_manifest(Path(view.path)).digest == view.digest
    assert view.files == 6 and view.safetensors == 2 and view.bytes_done == view.bytes_total > 0
    assert list(jobs.cache.staging.iterdir()) == []  # staging renamed away, nothing half-made left
    assert jobs.cache.digests() == [view.digest]
    # The record on disk says the same (a restarted agent reads it).
    again = jobs_for(tmp_path, m.url).view("tiny.node-a")
    assert again.state == "Ready" and again.digest == view.digest


def test_pinned_revision_and_unknown_revision(tmp_path):
    with mirror(tmp_path) as m:
        jobs = jobs_for(tmp_path, m.url)
        sha = commit_of(tmp_path / "mirror" / REPO)
        jobs.submit(request(f"hf://{REPO}@{sha}"))
        jobs.submit(request(f"hf://{REPO}@v9", job="other.node-a"))
        ok, bad = finish(jobs, "tiny.node-a"), finish(jobs, "other.node-a")
    assert ok.state == "Ready" and ok.revision == sha
    assert bad.state == "Failed" and "revision 'v9'" in bad.message
    assert states(bad) == ["Registered", "Resolving", "Failed"]


def test_llama_layout_is_ready_with_only_what_the_runtime_loads(tmp_path):
    """A Llama 3.x-style repository (the lab mirror's layout): safetensors beside original/*.pth
    and a .bin copy. The pickles and the copy are never requested and never on disk."""
    with mirror(tmp_path, llama_layout=True) as m:
        jobs = jobs_for(tmp_path, m.url)
        jobs.submit(request())
        view = finish(jobs, "tiny.node-a")
        fetched = {r[1].split("/resolve/", 1)[1].split("/", 1)[1] for r in m.cfg.requests
                   if r[0] == "GET" and "/resolve/" in r[1]}
    assert view.state == "Ready", view.message
    on_disk = sorted(str(p.relative_to(view.path)) for p in Path(view.path).rglob("*") if p.is_file())
    assert not [n for n in on_disk if n.endswith((".pth", ".pt", ".pkl", ".bin"))]
    assert not [n for n in on_disk if n.startswith("original/") or n in ("README.md", ".gitattributes")]
    assert "model.safetensors.index.json" in on_disk and "tokenizer.json" in on_disk
    assert fetched == set(on_disk)  # the skipped files were never downloaded
    assert view.files == 6 and view.safetensors == 2


def test_pickle_only_repository_is_refused_before_download_but_bin_is_not_a_pickle(tmp_path):
    root = tmp_path / "mirror" / REPO
    with mirror(tmp_path) as m:
        for f in root.glob("*.safetensors*"):
            f.unlink()
        (root / "pytorch_model.bin").write_bytes(b"\0" * 100)
        jobs = jobs_for(tmp_path, m.url)
        jobs.submit(request())
        ok = finish(jobs, "tiny.node-a")
        assert ok.state == "Ready", ok.message  # without safetensors a .bin is what the engine loads
        assert (Path(ok.path) / "pytorch_model.bin").exists()
        (root / "original").mkdir()
        (root / "original" / "consolidated.00.pth").write_bytes(b"\x80\x04pickle")
        jobs.submit(request(attempt=1))
        view = finish(jobs, "tiny.node-a")
        downloads = [r for r in m.cfg.requests if r[0] == "GET" and r[1].endswith(".pth")]
    assert view.state == "Failed"
    assert "original/consolidated.00.pth is a pickle file" in view.message and view.message.startswith("Scanning:")
    assert downloads == []  # refused from the file list, before any byte came


def test_too_many_files_is_refused(tmp_path):
    with mirror(tmp_path) as m:
        jobs = jobs_for(tmp_path, m.url, max_files=3)
        jobs.submit(request())
        view = finish(jobs, "tiny.node-a")
    assert view.state == "Failed" and "FABRIC_MODEL_MAX_FILES (3)" in view.message


def test_checksum_rules(tmp_path):
    digest = build_manifest(write_tiny_model(tmp_path / "ref")).digest
    with mirror(tmp_path) as m:
        jobs = jobs_for(tmp_path, m.url)
        jobs.submit(request(job="a.n", require_checksum=True))
        jobs.submit(request(job="b.n", expected_digest="0" * 64))
        missing, wrong = finish(jobs, "a.n"), finish(jobs, "b.n")
        jobs.submit(request(job="c.n", require_checksum=True, expected_digest=digest))
        right = finish(jobs, "c.n")
    assert missing.state == "Failed" and "require_checksum is set but the model has no expected digest" in missing.message
    assert wrong.state == "Failed" and "checksum mismatch" in wrong.message and digest in wrong.message
    assert right.state == "Ready" and right.digest == digest
    assert jobs.cache.digests() == [digest]  # failed checks published nothing


def test_signature_rules(tmp_path):
    digest = build_manifest(write_tiny_model(tmp_path / "ref")).digest
    key = b"signing-secret-123"
    with mirror(tmp_path) as m:
        jobs = jobs_for(tmp_path, m.url, signing_key=key)
        jobs.submit(request(job="bad.n", signature="ab" * 32))
        jobs.submit(request(job="good.n", signature=signature_of(digest, key)))
        bad, good = finish(jobs, "bad.n"), finish(jobs, "good.n")
        keyless = jobs_for(tmp_path / "k", m.url)
        keyless.submit(request(job="nokey.n", signature=signature_of(digest, key)))
        nokey = finish(keyless, "nokey.n")
    assert bad.state == "Failed" and "bad signature" in bad.message
    assert good.state == "Ready"
    assert nokey.state == "Failed" and "FABRIC_MODEL_SIGNING_KEY is not set" in nokey.message
    assert key.decode() not in bad.message + nokey.message


def test_gated_repository_without_token_names_the_cause_not_the_token(tmp_path):
    token = "hf_secretTOKENvalue42"
    with mirror(tmp_path, gated={REPO: token}) as m:
        no_token = jobs_for(tmp_path / "a", m.url)
        no_token.submit(request())
        refused = finish(no_token, "tiny.node-a")
        wrong = jobs_for(tmp_path / "b", m.url, env={"HF_TOKEN": "hf_wrongTOKEN99"})
        wrong.submit(request())
        wrong_view = finish(wrong, "tiny.node-a")
        token_file = tmp_path / "token"
        token_file.write_text(token + "\n")
        good = jobs_for(tmp_path / "c", m.url, env={"FABRIC_HF_TOKEN_FILE": str(token_file)})
        good.submit(request())
        ok = finish(good, "tiny.node-a")
    assert refused.state == "Failed"
    assert "gated" in refused.message and "no Hugging Face token" in refused.message
    assert wrong_view.state == "Failed" and "token was refused" in wrong_view.message
    assert ok.state == "Ready", ok.message
    for d in (tmp_path / "a", tmp_path / "b", tmp_path / "c"):
        for f in (d / "state" / "models" / "jobs").glob("*.json"):
            text = f.read_text()
            assert token not in text and "hf_wrongTOKEN99" not in text


def test_unreachable_mirror_is_retried_then_failed_with_the_count(tmp_path):
    jobs = jobs_for(tmp_path, "http://127.0.0.1:9", retries=2)
    jobs.submit(request())
    view = finish(jobs, "tiny.node-a")
    assert view.state == "Failed" and "gave up after 2 retries" in view.message
    assert view.retries == 2


@pytest.mark.root
def test_not_enough_disk_is_refused_before_downloading(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    state = tmp_path / "state" / "models"
    state.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(state)], check=True)
    try:
        with mirror(tmp_path, extra_bytes=600_000) as m:
            jobs = jobs_for(tmp_path, m.url)
            jobs.submit(request())
            view = finish(jobs, "tiny.node-a")
            got = [r for r in m.cfg.requests if r[0] == "GET" and "/resolve/" in r[1]]
    finally:
        subprocess.run(["umount", str(state)], check=True)
    assert view.state == "Failed" and "not enough disk" in view.message
    assert states(view) == ["Registered", "Resolving", "Failed"]
    assert got == []


def test_two_jobs_for_the_same_source_join_and_download_once(tmp_path):
    with mirror(tmp_path, rate=200_000, extra_bytes=300_000) as m:
        jobs = jobs_for(tmp_path, m.url)
        jobs.submit(request(job="first.node-a"))
        jobs.submit(request(job="second.node-a"))
        a, b = finish(jobs, "first.node-a"), finish(jobs, "second.node-a")
        gets = [r for r in m.cfg.requests if r[0] == "GET" and "/resolve/" in r[1]]
    assert a.state == b.state == "Ready"
    assert a.digest == b.digest and a.path == b.path
    joined = [v for v in (a, b) if v.joined]
    assert len(joined) == 1 and joined[0].joined in ("first.node-a", "second.node-a")
    assert "joined job" in " ".join(t.message for t in joined[0].history)
    assert len(gets) == 6  # each of the six files once


def test_local_source_is_hashed_in_place_and_escapes_are_refused(tmp_path):
    srv = tmp_path / "srv-models"
    model = write_tiny_model(srv / "tiny")
    outside = write_tiny_model(tmp_path / "outside")
    (srv / "link").symlink_to(outside)
    jobs = jobs_for(tmp_path, "http://127.0.0.1:9")
    jobs.submit(request(f"file://{model}", job="local.n"))
    jobs.submit(request(f"{srv}/../outside", job="dots.n"))
    jobs.submit(request(f"{srv}/link", job="link.n"))
    ok, dots, link = finish(jobs, "local.n"), finish(jobs, "dots.n"), finish(jobs, "link.n")
    assert ok.state == "Ready" and ok.path == os.path.realpath(model)
    assert states(ok) == ["Registered", "Resolving", "Verifying", "Scanning", "Ready"]
    assert list(jobs.cache.by_digest.iterdir()) == []  # never copied
    assert jobs.cache.path_for(ok.digest) == Path(os.path.realpath(model))
    assert dots.state == "Failed" and "outside FABRIC_MODEL_DIR" in dots.message
    assert link.state == "Failed" and "goes through a symlink" in link.message


def test_symlink_inside_a_local_model_is_refused_without_reading_its_target(tmp_path):
    srv = tmp_path / "srv-models"
    model = write_tiny_model(srv / "tiny")
    (model / "passwd.safetensors").symlink_to("/etc/passwd")
    jobs = jobs_for(tmp_path, "http://127.0.0.1:9")
    jobs.submit(request(str(model), job="sym.n"))
    view = finish(jobs, "sym.n")
    assert view.state == "Failed" and "passwd.safetensors is a symlink" in view.message


def test_a_repository_id_the_library_refuses_fails_at_once(tmp_path):
    jobs = jobs_for(tmp_path, "http://127.0.0.1:9")
    jobs.submit(request("hf://a/b--..c"))
    view = finish(jobs, "tiny.node-a")
    assert view.state == "Failed" and "not a valid repository" in view.message and view.retries == 0


def test_the_library_writes_each_piece_as_received_not_regrouped_into_10_mib(tmp_path):
    # HfFetcher sets huggingface_hub's DOWNLOAD_CHUNK_SIZE to None: http_get then writes what the
    # socket hands over instead of copying it into 10 MiB groups first (the download's bottleneck).
    from huggingface_hub.file_download import http_get

    from agent.models.hf_fetch import HfFetcher

    class Recorder:
        def __init__(self):
            self.sizes: list[int] = []

        def write(self, data: bytes) -> int:
            self.sizes.append(len(data))
            return len(data)

        def tell(self) -> int:
            return sum(self.sizes)

    with mirror(tmp_path, extra_bytes=12_000_000) as m:
        fetcher = HfFetcher({"HF_ENDPOINT": m.url})
        resolved = fetcher.resolve(REPO, "main")
        big = max(resolved.files, key=lambda f: f.size or 0)
        out = Recorder()
        http_get(f"{m.url}/{REPO}/resolve/{resolved.revision}/{big.name}", out, expected_size=big.size)
    assert sum(out.sizes) == big.size > 10 << 20
    assert len(out.sizes) > 2 and max(out.sizes) < 10 << 20


def test_a_model_made_again_from_another_source_gets_its_own_job_not_the_old_failure(tmp_path):
    """fabricd's job id is model.node and a re-created model starts again at attempt 0: the agent
    must not answer with the deleted model's record (same id, other source)."""
    with mirror(tmp_path) as m:
        jobs = jobs_for(tmp_path, m.url)
        jobs.submit(request("hf://nobody/missing"))
        old = finish(jobs, "tiny.node-a")
        assert old.state == "Failed" and "nobody/missing" in old.message
        assert jobs.submit(request("hf://nobody/missing")).state == "Failed"  # the same ask: the same answer
        jobs.submit(request())  # the model deleted and made again from the mirror's repository
        new = finish(jobs, "tiny.node-a")
    assert new.state == "Ready", new.message
    assert states(new) == ["Registered", "Resolving", "Downloading", "Verifying", "Scanning", "Ready"]


def test_a_resolved_commit_is_the_same_ask_and_another_commit_is_not():
    from agent.models.jobs import same_bytes

    base = request()
    assert same_bytes(base, request(revision="a" * 40))  # fabricd fills in what a node resolved
    assert not same_bytes(request(revision="a" * 40), request(revision="b" * 40))
    assert not same_bytes(base, request(expected_digest="0" * 64))
