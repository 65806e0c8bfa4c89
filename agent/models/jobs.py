"""Model jobs on the agent: durable, resumable, one thread each.

A job (``AgentJobRequest`` from fabricd, idempotent by id and attempt) runs
Resolving -> Downloading -> Verifying -> Scanning -> Ready, or Failed with a message. Every
state change is written to ``jobs/<id>.json`` (write-then-rename) before the work of that
state starts, so an agent killed at any point restarts each unfinished job from its record;
the files already downloaded stay in staging and a partial file is resumed with a Range
request (agent.models.hf_fetch).

Joining: work is keyed by its source (repo@commit, or a local realpath). A second job whose
source another job is fetching waits for it (``joined`` names that job, its progress is the
shared staging directory) and then only applies its own checksum and signature rules to the
digest the first produced; a source already in the cache is not fetched again.

Transient fetch errors (connection lost, 5xx) are retried ``retries`` times with a growing
pause, counted in the record; refusals (a check, a gated repository, no disk) fail at once.
Staging directories of refused jobs are deleted; those of jobs that failed on the network are
kept so the next attempt resumes.
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
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel

from agent.models.cache import ModelCache, dir_size
from agent.models.checks import (
    DEFAULT_MAX_FILES,
    CheckFailed,
    Manifest,
    build_manifest,
    check_policy,
    scan,
    scan_names,
)
from agent.models.hf_fetch import FetchFailed, HfFetcher, Resolved, parse_hf_source
from common.model_api import TERMINAL, AgentJobRequest, AgentJobView, Transition, local_source_path

log = logging.getLogger("fabric-agent.models")


@dataclass(frozen=True)
class ModelSettings:
    model_dir: str = "/srv/models"  # FABRIC_MODEL_DIR: local sources must be under it
    max_files: int = DEFAULT_MAX_FILES  # FABRIC_MODEL_MAX_FILES
    signing_key: bytes | None = None  # FABRIC_MODEL_SIGNING_KEY
    retries: int = 3  # FABRIC_MODEL_RETRIES
    retry_base_s: float = 1.0
    download_workers: int = 4  # FABRIC_MODEL_DOWNLOAD_WORKERS: files fetched at once
    env: dict[str, str] = field(default_factory=dict)  # HF_ENDPOINT, HF_TOKEN, FABRIC_HF_TOKEN_FILE

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> ModelSettings:
        env = dict(os.environ if env is None else env)

        def number(name: str, default: int) -> int:
            raw = env.get(name, "").strip()
            try:
                value = int(raw) if raw else default
            except ValueError:
                raise ValueError(f"{name}={raw!r} is not a whole number") from None
            if value < 0:
                raise ValueError(f"{name}={raw!r} must not be negative")
            return value

        key = env.get("FABRIC_MODEL_SIGNING_KEY", "")
        return cls(model_dir=env.get("FABRIC_MODEL_DIR", "/srv/models") or "/srv/models",
                   max_files=number("FABRIC_MODEL_MAX_FILES", DEFAULT_MAX_FILES),
                   signing_key=key.encode() if key else None,
                   retries=number("FABRIC_MODEL_RETRIES", 3),
                   download_workers=number("FABRIC_MODEL_DOWNLOAD_WORKERS", 4) or 1,
                   env={k: v for k, v in env.items() if k in ("HF_ENDPOINT", "HF_TOKEN", "FABRIC_HF_TOKEN_FILE")})


class _Record(BaseModel):
    request: AgentJobRequest
    view: AgentJobView
    source_key: str | None = None


class _Claim:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.owner: str | None = None


def _source_key(kind: str, text: str) -> str:
    return f"{kind}-{hashlib.sha256(text.encode()).hexdigest()[:32]}"


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
            fresh = rec is None or req.attempt > rec.request.attempt
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
        try:
            self._set(rec, "Resolving", f"resolving {rec.request.source}")
            if rec.request.source.startswith("hf://"):
                self._run_hf_with_retries(rec)
            else:
                self._run_local(rec)
        except CheckFailed as exc:
            self._set(rec, "Failed", f"{exc.stage}: {exc.message}")
        except FetchFailed as exc:
            self._set(rec, "Failed", exc.message)
        except OSError as exc:
            self._set(rec, "Failed", f"{rec.view.state}: {type(exc).__name__}: {exc.strerror or exc}")
        finally:
            self._hashed.pop(job_id, None)

    def _run_hf_with_retries(self, rec: _Record) -> None:
        retries = self.settings.retries
        for n in range(retries + 1):
            try:
                return self._run_hf(rec)
            except FetchFailed as exc:
                if not exc.transient or n == retries:
                    if exc.transient:
                        raise FetchFailed(f"{exc.message} (gave up after {retries} retries)", transient=True) from None
                    raise
                pause = self.settings.retry_base_s * 2**n
                self._set(rec, message=f"{exc.message}; retry {n + 1} of {retries} in {pause:g}s",
                          retries=rec.view.retries + 1)
                if self._stop.wait(pause):
                    return

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

    def _run_hf(self, rec: _Record) -> None:
        req = rec.request
        repo, rev = parse_hf_source(req.source)
        rev = req.revision or rev
        fetcher = self.fetcher()
        resolved = fetcher.resolve(repo, rev)
        scan_names([f.name for f in resolved.files], self.settings.max_files)
        key = _source_key("hf", f"{repo}@{resolved.revision}")
        rec.source_key = key
        self._set(rec, message=f"{repo}@{rev} is commit {resolved.revision}: {len(resolved.files)} files, "
                               f"{resolved.size} bytes", revision=resolved.revision,
                  bytes_total=max(resolved.size, req.size_bytes or 0), files=len(resolved.files))
        with self._claim(rec, key):
            digest = self.cache.digest_of_source(key)
            if digest is not None:
                return self._from_cache(rec, digest)
            staging = self.cache.staging / key
            self._check_disk(rec, staging)
            self._set(rec, "Downloading", f"downloading {len(resolved.files)} files from {fetcher.endpoint}",
                      joined=None)
            self._download(fetcher, resolved, staging)
            manifest = self._verify(rec, staging, resolved)
            self._set(rec, "Scanning", "scanning file names and types")
            safetensors = scan(staging, self.settings.max_files)
            path = self.cache.publish(staging, manifest.digest, key)
            self._ready(rec, manifest, path, safetensors)

    def _check_disk(self, rec: _Record, staging: Path) -> None:
        have = dir_size(staging) if staging.exists() else 0
        need = max(rec.view.bytes_total - have, 0)
        free = self.cache.free_bytes()
        if free < need:
            raise CheckFailed("Resolving", f"not enough disk: the model needs {need} more bytes and "
                                           f"{free} are free under {self.cache.root}")

    def _download(self, fetcher: HfFetcher, resolved: Resolved, staging: Path) -> None:
        fetcher.download_all(resolved, staging, self.settings.download_workers)

    def _verify(self, rec: _Record, root: Path, resolved: Resolved | None) -> Manifest:
        self._hashed[rec.view.job_id] = 0
        self._set(rec, "Verifying", "hashing every file", bytes_done=0)

        def hashed(n: int) -> None:
            self._hashed[rec.view.job_id] = self._hashed.get(rec.view.job_id, 0) + n

        manifest = build_manifest(root, self.settings.max_files, on_bytes=hashed)
        if resolved is not None:
            listed = {f.name: f for f in resolved.files}
            for e in manifest.entries:
                want = listed.get(e.path)
                if want is None:
                    raise CheckFailed("Verifying", f"{e.path} is not in the repository's file list")
                if want.sha256 and want.sha256 != e.sha256:
                    raise CheckFailed("Verifying", f"{e.path}: SHA-256 differs from the repository's")
            missing = sorted(set(listed) - {e.path for e in manifest.entries})
            if missing:
                raise CheckFailed("Verifying", f"files missing after download: {', '.join(missing[:5])}")
        self._policy(rec, manifest.digest)
        return manifest

    def _policy(self, rec: _Record, digest: str) -> None:
        req = rec.request
        check_policy(digest, expected_digest=req.expected_digest, require_checksum=req.require_checksum,
                     signature=req.signature, signing_key=self.settings.signing_key)

    def _from_cache(self, rec: _Record, digest: str) -> None:
        joined = rec.view.joined
        self._set(rec, "Verifying", f"bytes already verified as {digest}" + (f" by job {joined}" if joined else ""))
        self._policy(rec, digest)
        path = self.cache.path_for(digest)
        self.cache.touch(digest)
        self._set(rec, "Ready", f"ready: {digest}", digest=digest, path=str(path),
                  bytes_done=rec.view.bytes_total)

    def _run_local(self, rec: _Record) -> None:
        try:
            path = Path(local_source_path(rec.request.source, self.settings.model_dir))
        except ValueError as exc:
            raise CheckFailed("Resolving", str(exc)) from None
        if not path.is_dir():
            raise CheckFailed("Resolving", f"local source {path} is not a directory on this node")
        key = _source_key("local", str(path))
        rec.source_key = key
        self._set(rec, message=f"local source {path}; hashed in place, never copied")
        with self._claim(rec, key):
            manifest = self._verify(rec, path, None)
            self._set(rec, "Scanning", "scanning file names and types")
            safetensors = scan(path, self.settings.max_files)
            self.cache.publish_local(path, manifest.digest, key)
            self._ready(rec, manifest, path, safetensors)

    def _ready(self, rec: _Record, manifest: Manifest, path: Path, safetensors: int) -> None:
        self._set(rec, "Ready", f"ready: {len(manifest.entries)} files ({safetensors} safetensors), "
                                f"{manifest.size} bytes, digest {manifest.digest}",
                  digest=manifest.digest, path=str(path), bytes_done=manifest.size, bytes_total=manifest.size,
                  files=len(manifest.entries), safetensors=safetensors)
