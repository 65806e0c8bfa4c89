"""Model jobs on the agent: durable, resumable, one thread each.

A job (``AgentJobRequest`` from fabricd, idempotent by id and attempt) runs
Resolving -> Downloading -> Verifying -> Scanning -> Ready, or Failed with a message. Every
state change is written to ``jobs/<id>.json`` (write-then-rename) before the work of that
state starts, so an agent killed at any point restarts each unfinished job from its record;
the files already downloaded stay in staging and a partial file is resumed with a Range
request (agent.models.hf_fetch). Only the files a runtime loads are fetched
(agent.models.file_selection); the listing check, the per-file hashes and the scan judge those.

Joining: work is keyed by its source (repo@commit, or a local realpath). A second job whose
source another job is fetching waits for it (``joined`` names that job, its progress is the
shared staging directory) and then only applies its own checksum and signature rules to the
digest the first produced; a source already in the cache is not fetched again.

Transient fetch errors (connection lost, 5xx) are retried ``retries`` times with a growing
pause, counted in the record; refusals (a check, a gated repository, no disk) fail at once.
Staging directories of refused jobs are deleted; those of jobs that failed on the network are
kept so the next attempt resumes.

Adapters: a job's ``adapters`` (LoRA adapters of the model) are fetched after the model, one by
one, each through the same states and checks (its messages start "adapter NAME:"), into the same
cache (by-digest/, joined and cached by source like any model); the job is Ready only once every
adapter is, and its view names each adapter's digest. ``bytes_total`` grows as each adapter is
resolved (each adapter's size is known only then).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from pydantic import BaseModel

from agent.models.cache import ModelCache, dir_size
from agent.models.checks import (
    CheckFailed,
    Manifest,
    build_manifest,
    check_policy,
    scan,
    scan_names,
)
from agent.models.file_selection import select_files
from agent.models.hf_fetch import FetchFailed, HfFetcher, Resolved, parse_hf_source
from agent.settings import ModelSettings
from common.model_api import (
    TERMINAL,
    AdapterFetched,
    AgentJobRequest,
    AgentJobView,
    Transition,
    local_source_path,
)

log = logging.getLogger("fabric-agent.models")


class _Record(BaseModel):
    request: AgentJobRequest
    view: AgentJobView
    source_key: str | None = None  # the source being fetched now (progress reads its staging size)
    done_before: int = 0  # bytes of the job's sources finished before it (the model, earlier adapters)


class _Claim:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.owner: str | None = None


def _source_key(kind: str, text: str) -> str:
    return f"{kind}-{hashlib.sha256(text.encode()).hexdigest()[:32]}"


def same_bytes(a: AgentJobRequest, b: AgentJobRequest) -> bool:
    """Two requests under one job id ask for the same bytes: the same source, expected digest and
    adapters, and no two different commits (a commit filled in once resolved is the same ask)."""
    def ask(r: AgentJobRequest):
        return r.source, r.expected_digest, [(x.name, x.source, x.expected_digest) for x in r.adapters]

    return ask(a) == ask(b) and (a.revision is None or b.revision is None or a.revision == b.revision)


class ModelJobs:
    def __init__(self, cache: ModelCache, settings: ModelSettings,
                 fetcher: Callable[[], HfFetcher] | None = None, clock: Callable[[], float] = time.time):
        self.cache = cache
        self.settings = settings
        self.fetcher = fetcher or (lambda: HfFetcher(settings.env))
        self.clock = clock
        self._mu = threading.Lock()
        self._claims: dict[str, _Claim] = {}
        self._threads: dict[str, threading.Thread] = {}
        self._hashed: dict[str, int] = {}  # job id -> bytes hashed so far (Verifying progress)
        self._stop = threading.Event()

    # -- records --------------------------------------------------------------------------------
    def _path(self, job_id: str) -> Path:
        return self.cache.jobs / f"{job_id}.json"

    def _load(self, job_id: str) -> _Record | None:
        p = self._path(job_id)
        return _Record.model_validate_json(p.read_text()) if p.exists() else None

    def _save(self, rec: _Record) -> None:
        p = self._path(rec.view.job_id)
        tmp = p.with_suffix(f".tmp{threading.get_ident()}")
        tmp.write_text(rec.model_dump_json())
        os.replace(tmp, p)

    def _set(self, rec: _Record, state: str | None = None, message: str | None = None, **fields) -> None:
        v = rec.view
        if state is not None and state != v.state:
            v.history.append(Transition(state=state, at=self.clock(), message=message or ""))
            v.state = state
        if message is not None:
            v.message = message
        for k, val in fields.items():
            setattr(v, k, val)
        self._save(rec)
        log.info("model job %s: %s %s", v.job_id, v.state, v.message)

    # -- API ------------------------------------------------------------------------------------
    def submit(self, req: AgentJobRequest) -> AgentJobView:
        with self._mu:
            rec = self._load(req.job_id)
            # A new attempt, or a request for other bytes under the same id (the model was deleted
            # and made again from another source): a job of its own, never the old one's answer.
            fresh = rec is None or req.attempt > rec.request.attempt or not same_bytes(req, rec.request)
            if fresh:
                rec = _Record(request=req, view=AgentJobView(job_id=req.job_id, attempt=req.attempt,
                                                             history=[Transition(state="Registered",
                                                                                 at=self.clock())],
                                                             message="job registered on the node"))
                self._save(rec)
            self._ensure_running(rec)
            return self.view(req.job_id) or rec.view

    def _ensure_running(self, rec: _Record) -> None:
        jid = rec.view.job_id
        if rec.view.state in TERMINAL:
            return
        t = self._threads.get(jid)
        if t is not None and t.is_alive():
            return
        t = threading.Thread(target=self._run, args=(jid,), name=f"model-job-{jid}", daemon=True)
        self._threads[jid] = t
        t.start()

    def resume_all(self) -> list[str]:
        """Restart every unfinished job from its record (agent start)."""
        resumed = []
        with self._mu:
            for p in sorted(self.cache.jobs.glob("*.json")):
                rec = self._load(p.stem)
                if rec is not None and rec.view.state not in TERMINAL:
                    self._ensure_running(rec)
                    resumed.append(p.stem)
        return resumed

    def view(self, job_id: str) -> AgentJobView | None:
        rec = self._load(job_id)
        if rec is None:
            return None
        v = rec.view
        if v.state == "Downloading" and rec.source_key:
            staged = self.cache.staging / rec.source_key
            done = dir_size(staged) if staged.exists() else 0
            done += rec.done_before
            v.bytes_done = min(done, v.bytes_total) if v.bytes_total else done
        elif v.state == "Verifying" and job_id in self._hashed:
            v.bytes_done = self._hashed[job_id]
        return v

    def list(self) -> list[AgentJobView]:
        return [v for p in sorted(self.cache.jobs.glob("*.json")) if (v := self.view(p.stem)) is not None]

    def forget_digest(self, digest: str) -> list[str]:
        """Drop the records of finished jobs that produced this digest (it was evicted)."""
        dropped = []
        with self._mu:
            for p in self.cache.jobs.glob("*.json"):
                rec = self._load(p.stem)
                if rec is not None and rec.view.digest == digest and rec.view.state in TERMINAL:
                    p.unlink(missing_ok=True)
                    dropped.append(p.stem)
        return dropped

    def stop(self) -> None:
        self._stop.set()

    # -- the work -------------------------------------------------------------------------------
    def _run(self, job_id: str) -> None:
        rec = self._load(job_id)
        if rec is None:
            return
        req = rec.request
        try:
            self._set(rec, "Resolving", f"resolving {req.source}")
            rec.done_before = 0
            got = self._fetch(rec, _Want("", req.source, req.revision, req.expected_digest, req.require_checksum,
                                         req.signature, req.size_bytes, req.tenant))
            fetched: dict[str, AdapterFetched] = {}
            done = got.size
            for a in req.adapters:  # after the model, one by one, the same way (module docstring)
                rec.done_before = done
                self._set(rec, "Resolving", f"adapter {a.name}: resolving {a.source}")
                one = self._fetch(rec, _Want(f"adapter {a.name}: ", a.source, a.revision, a.expected_digest,
                                             tenant=req.tenant))
                fetched[a.name] = AdapterFetched(source=a.source, digest=one.digest, revision=one.revision,
                                                 size_bytes=one.size, files=one.files)
                done += one.size
            self._ready(rec, got, fetched)
        except _Stopping:
            return  # the record keeps its state; the next agent start resumes the job
        except CheckFailed as exc:
            self._set(rec, "Failed", f"{exc.stage}: {exc.message}")
        except FetchFailed as exc:
            self._set(rec, "Failed", exc.message)
        except OSError as exc:
            self._set(rec, "Failed", f"{rec.view.state}: {type(exc).__name__}: {exc.strerror or exc}")
        finally:
            self._hashed.pop(job_id, None)

    def _fetch(self, rec: _Record, want: _Want) -> _Got:
        """One source; a refusal names the adapter it is about (``want.label``)."""
        try:
            if want.source.startswith("hf://"):
                return self._hf_with_retries(rec, want)
            return self._local(rec, want)
        except CheckFailed as exc:
            raise CheckFailed(exc.stage, f"{want.label}{exc.message}") from None
        except FetchFailed as exc:
            raise FetchFailed(f"{want.label}{exc.message}", transient=exc.transient) from None

    def _hf_with_retries(self, rec: _Record, want: _Want) -> _Got:
        retries = self.settings.retries
        for n in range(retries + 1):
            try:
                return self._hf(rec, want)
            except FetchFailed as exc:
                if not exc.transient or n == retries:
                    if exc.transient:
                        raise FetchFailed(f"{exc.message} (gave up after {retries} retries)", transient=True) from None
                    raise
                pause = self.settings.retry_base_s * 2**n
                self._set(rec, message=f"{want.label}{exc.message}; retry {n + 1} of {retries} in {pause:g}s",
                          retries=rec.view.retries + 1)
                if self._stop.wait(pause):
                    raise _Stopping() from None
        raise _Stopping()  # unreachable: the last pass returns or raises

    @contextmanager
    def _claim(self, rec: _Record, key: str) -> Iterator[None]:
        with self._mu:
            claim = self._claims.setdefault(key, _Claim())
        if not claim.lock.acquire(blocking=False):
            self._set(rec, "Downloading", f"joined job {claim.owner}: it is fetching the same source",
                      joined=claim.owner)
            while not claim.lock.acquire(timeout=0.5):
                if self._stop.is_set():
                    raise FetchFailed("the agent is stopping", transient=True)
        claim.owner = rec.view.job_id
        try:
            yield
        except (CheckFailed, FetchFailed) as exc:
            # Refused bytes go while the claim is held, so a job that joined cannot lose the files
            # it starts fetching next; bytes cut off by the network stay for the resume.
            if isinstance(exc, CheckFailed) or not exc.transient:
                shutil.rmtree(self.cache.staging / key, ignore_errors=True)
            raise
        finally:
            claim.owner = None
            claim.lock.release()

    def _hf(self, rec: _Record, want: _Want) -> _Got:
        repo, rev = parse_hf_source(want.source)
        rev = want.revision or rev
        fetcher = self.fetcher()
        listing = fetcher.resolve(repo, rev)
        resolved = _selected(listing)
        scan_names([f.name for f in resolved.files], self.settings.max_files)
        key = _source_key("hf", f"{repo}@{resolved.revision}")
        rec.source_key = key
        size = max(resolved.size, want.size_bytes or 0)
        about = {"revision": resolved.revision, "files": len(resolved.files)} if want.is_model else {}
        skipped = len(listing.files) - len(resolved.files)
        self._set(rec, message=f"{want.label}{repo}@{rev} is commit {resolved.revision}: {len(resolved.files)} "
                               f"files, {resolved.size} bytes"
                               + (f" ({skipped} files no runtime loads are skipped)" if skipped else ""),
                  bytes_total=rec.done_before + size, **about)
        with self._claim(rec, key):
            digest = self.cache.digest_of_source(key, want.tenant)
            if digest is not None:
                return self._from_cache(rec, want, digest, resolved)
            staging = self.cache.staging / key
            self._check_disk(rec, staging)
            self._set(rec, "Downloading", f"{want.label}downloading {len(resolved.files)} files from "
                                          f"{fetcher.endpoint}", joined=None)
            self._download(fetcher, resolved, staging)
            manifest = self._verify(rec, want, staging, resolved)
            self._set(rec, "Scanning", f"{want.label}scanning file names and types")
            safetensors = scan(staging, self.settings.max_files)
            path = self.cache.publish(staging, manifest.digest, key, manifest.text())
            return _Got(manifest.digest, path, len(manifest.entries), manifest.size, safetensors,
                        resolved.revision, manifest)

    def _check_disk(self, rec: _Record, staging: Path) -> None:
        have = dir_size(staging) if staging.exists() else 0
        need = max(rec.view.bytes_total - rec.done_before - have, 0)
        free = self.cache.free_bytes()
        if free < need:
            raise CheckFailed("Resolving", f"not enough disk: the model needs {need} more bytes and "
                                           f"{free} are free under {self.cache.root}")

    def _download(self, fetcher: HfFetcher, resolved: Resolved, staging: Path) -> None:
        fetcher.download_all(resolved, staging, self.settings.download_workers)

    def _verify(self, rec: _Record, want: _Want, root: Path, resolved: Resolved | None) -> Manifest:
        jid = rec.view.job_id
        self._hashed[jid] = rec.done_before
        self._set(rec, "Verifying", f"{want.label}hashing every file", bytes_done=rec.done_before)

        def hashed(n: int) -> None:
            self._hashed[jid] = self._hashed.get(jid, 0) + n

        manifest = build_manifest(root, self.settings.max_files, on_bytes=hashed)
        if resolved is not None:
            listed = {f.name: f for f in resolved.files}
            for e in manifest.entries:
                want_file = listed.get(e.path)
                if want_file is None:
                    raise CheckFailed("Verifying", f"{e.path} is not in the repository's file list")
                if want_file.sha256 and want_file.sha256 != e.sha256:
                    raise CheckFailed("Verifying", f"{e.path}: SHA-256 differs from the repository's")
            missing = sorted(set(listed) - {e.path for e in manifest.entries})
            if missing:
                raise CheckFailed("Verifying", f"files missing after download: {', '.join(missing[:5])}")
        self._policy(want, manifest.digest)
        return manifest

    def _policy(self, want: _Want, digest: str) -> None:
        check_policy(digest, expected_digest=want.expected_digest, require_checksum=want.require_checksum,
                     signature=want.signature, signing_key=self.settings.signing_key)

    def _from_cache(self, rec: _Record, want: _Want, digest: str, resolved: Resolved) -> _Got:
        joined = rec.view.joined
        self._set(rec, "Verifying", f"{want.label}bytes already verified as {digest}"
                                    + (f" by job {joined}" if joined else ""))
        self._policy(want, digest)
        path = self.cache.path_for(digest, want.tenant)
        self.cache.touch(digest)
        return _Got(digest, path, len(resolved.files), resolved.size, None, resolved.revision, None)

    def _local(self, rec: _Record, want: _Want) -> _Got:
        try:
            path = Path(local_source_path(want.source, self.settings.model_dir, want.tenant))
        except ValueError as exc:
            raise CheckFailed("Resolving", str(exc)) from None
        if not path.is_dir():
            raise CheckFailed("Resolving", f"local source {path} is not a directory on this node")
        key = _source_key("local", str(path))
        rec.source_key = key
        self._set(rec, message=f"{want.label}local source {path}; hashed in place, never copied")
        with self._claim(rec, key):
            manifest = self._verify(rec, want, path, None)
            self._set(rec, "Scanning", f"{want.label}scanning file names and types")
            safetensors = scan(path, self.settings.max_files)
            self.cache.publish_local(path, manifest.digest, key, manifest.text(), want.tenant)
            return _Got(manifest.digest, path, len(manifest.entries), manifest.size, safetensors, None, manifest)

    def _ready(self, rec: _Record, got: _Got, adapters: dict[str, AdapterFetched]) -> None:
        extra = sum(a.size_bytes for a in adapters.values())
        also = f"; {len(adapters)} adapters ({extra} bytes)" if adapters else ""
        total = got.size + extra
        if got.manifest is None:  # the model's bytes were in the cache already
            self._set(rec, "Ready", f"ready: {got.digest}{also}", digest=got.digest, path=str(got.path),
                      bytes_done=max(rec.view.bytes_total, total), adapters=adapters)
            return
        self._set(rec, "Ready", f"ready: {got.files} files ({got.safetensors} safetensors), "
                                f"{got.size} bytes, digest {got.digest}{also}",
                  digest=got.digest, path=str(got.path), bytes_done=total, bytes_total=total,
                  files=got.files, safetensors=got.safetensors, adapters=adapters)


def _selected(listing: Resolved) -> Resolved:
    """The listing cut down to the files a runtime loads (agent.models.file_selection)."""
    keep = set(select_files(f.name for f in listing.files).keep)
    if not keep:
        raise CheckFailed("Resolving", f"{listing.repo} has no file a runtime loads (config, tokenizer or weights: "
                                       "safetensors, gguf, bin)")
    return replace(listing, files=tuple(f for f in listing.files if f.name in keep))


class _Stopping(Exception):
    """The agent is stopping during a retry pause: leave the job for the next start."""


@dataclass(frozen=True)
class _Want:
    """One source of a job: the model's (label ""), or one of its adapters' (label "adapter NAME: ",
    the prefix of every message about it). Adapters carry no checksum or signature rule of
    their own beyond an expected digest."""

    label: str
    source: str
    revision: str | None
    expected_digest: str | None
    require_checksum: bool = False
    signature: str | None = None
    size_bytes: int | None = None
    tenant: str | None = None  # the model's: its local sources lie in that tenant's root

    @property
    def is_model(self) -> bool:
        return not self.label


@dataclass(frozen=True)
class _Got:
    digest: str
    path: Path
    files: int
    size: int
    safetensors: int | None
    revision: str | None
    manifest: Manifest | None  # None: already verified (the cache held the source)
