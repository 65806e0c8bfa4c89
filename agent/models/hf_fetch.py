"""Resolve and download a Hugging Face repository with huggingface_hub (never our own HF HTTP).

  resolve   ``HfApi.model_info(repo, revision=REV, files_metadata=True)``: the commit sha the
            revision names (``main`` becomes a sha, stored by the job so every node fetches the
            same bytes), the file names, sizes and, for LFS files, their SHA-256.
  download  per file: ``get_hf_file_metadata`` (HEAD of the resolve URL: ETag, size, redirects,
            the library's error mapping) and ``http_get`` with ``resume_size`` into our own
            partial file, so a restarted agent continues a file where it stopped (a Range
            request) instead of starting again. ``hf_hub_download`` is not used for the bytes:
            it writes to a process-unique temporary file that it deletes on failure, so it
            cannot resume across a restart.
            The library's ``DOWNLOAD_CHUNK_SIZE`` is set to None here (``stream_as_received``):
            ``http_get`` then writes each piece as the socket hands it over instead of first
            gathering 10 MiB in a BytesIO and slicing it (two extra copies of every byte in Python),
            which doubled throughput on loopback; a killed agent also loses at most one socket read.
The endpoint is ``HF_ENDPOINT`` (the library's own setting, read here when the fetcher is made
so a mirror can be chosen per process). The token comes from ``HF_TOKEN`` or the file named by
``FABRIC_HF_TOKEN_FILE``, read at each use; it is passed to the library and nowhere else: error
messages are written here from the exception type, never from response text.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import huggingface_hub
import huggingface_hub.constants
from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_url
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.file_download import http_get
from huggingface_hub.utils import build_hf_headers, disable_progress_bars

DEFAULT_ENDPOINT = "https://huggingface.co"


class FetchFailed(Exception):
    """A resolve or download failed. ``transient`` errors are retried (the partial files stay)."""

    def __init__(self, message: str, *, transient: bool):
        super().__init__(message)
        self.message = message
        self.transient = transient


@dataclass(frozen=True)
class RemoteFile:
    name: str
    size: int | None
    sha256: str | None  # LFS files only


@dataclass(frozen=True)
class Resolved:
    repo: str
    revision: str  # a commit sha
    files: tuple[RemoteFile, ...]

    @property
    def size(self) -> int:
        return sum(f.size or 0 for f in self.files)


def parse_hf_source(source: str) -> tuple[str, str]:
    """hf://ORG/NAME[@REV] -> (ORG/NAME, REV or main)."""
    body = source.removeprefix("hf://")
    repo, _, rev = body.partition("@")
    return repo, rev or "main"


def read_token(env: Mapping[str, str]) -> str | None:
    """HF_TOKEN, else the first line of FABRIC_HF_TOKEN_FILE; None when neither is set."""
    token = env.get("HF_TOKEN", "").strip()
    if token:
        return token
    path = env.get("FABRIC_HF_TOKEN_FILE", "").strip()
    if path:
        try:
            return Path(path).read_text().strip() or None
        except OSError:
            return None
    return None


class HfFetcher:
    def __init__(self, env: Mapping[str, str] | None = None):
        # env: ModelSettings.env (HF_ENDPOINT, HF_TOKEN, FABRIC_HF_TOKEN_FILE), read at start
        self.env = dict(env or {})
        self.endpoint = (self.env.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
        disable_progress_bars()  # the agent's log is no place for tqdm bars
        stream_as_received()

    def _token(self) -> str | bool:
        # False, not None: None would let the library look for a token saved on this host.
        return read_token(self.env) or False

    def _explain(self, exc: Exception, repo: str, revision: str) -> FetchFailed:
        has_token = bool(read_token(self.env))
        if isinstance(exc, GatedRepoError):
            if has_token:
                return FetchFailed(f"repository {repo} is gated and the node's Hugging Face token was refused "
                                   "(request access to the repository for that account)", transient=False)
            return FetchFailed(f"repository {repo} is gated and this node has no Hugging Face token "
                               "(set HF_TOKEN or FABRIC_HF_TOKEN_FILE for fabric-agent)", transient=False)
        if isinstance(exc, RevisionNotFoundError):
            return FetchFailed(f"revision {revision!r} of {repo} does not exist", transient=False)
        if isinstance(exc, RepositoryNotFoundError):
            return FetchFailed(f"repository {repo} was not found at {self.endpoint} (or it is private and "
                               "the node's token cannot read it)", transient=False)
        if isinstance(exc, HfHubHTTPError):
            status = getattr(getattr(exc, "response", None), "status_code", None)
            transient = status is None or status >= 500 or status in (408, 429)
            return FetchFailed(f"{self.endpoint} answered HTTP {status} for {repo}", transient=transient)
        if isinstance(exc, (OSError, ValueError)) and "Consistency check failed" in str(exc):
            return FetchFailed(f"a file of {repo} arrived with the wrong size; retrying", transient=True)
        if isinstance(exc, ValueError):  # the library refused the repo id or revision as written
            return FetchFailed(f"{repo}@{revision} is not a valid repository and revision: {type(exc).__name__}",
                               transient=False)
        # Connection refused, timeouts, a connection cut mid-body: the partial file stays.
        return FetchFailed(f"cannot reach {self.endpoint}: {type(exc).__name__}", transient=True)

    def resolve(self, repo: str, revision: str) -> Resolved:
        try:
            info = HfApi(endpoint=self.endpoint).model_info(
                repo, revision=revision, files_metadata=True, token=self._token())
        except Exception as exc:  # noqa: BLE001 - mapped to a message we write ourselves
            raise self._explain(exc, repo, revision) from None
        if not info.sha:
            raise FetchFailed(f"{self.endpoint} did not say which commit {repo}@{revision} is", transient=False)
        files = tuple(
            RemoteFile(s.rfilename, s.size, s.lfs.sha256 if s.lfs else None) for s in (info.siblings or [])
        )
        return Resolved(repo, info.sha, files)

    def download(self, resolved: Resolved, file: RemoteFile, partial: Path, final: Path) -> None:
        """Fetch one file into ``partial`` (resuming what it holds), then rename it to ``final``."""
        url = hf_hub_url(resolved.repo, file.name, revision=resolved.revision, endpoint=self.endpoint)
        token = self._token()
        try:
            meta = get_hf_file_metadata(url, token=token, endpoint=self.endpoint)
            size = meta.size if meta.size is not None else file.size
            partial.parent.mkdir(parents=True, exist_ok=True)
            have = partial.stat().st_size if partial.exists() else 0
            if size is not None and have > size:
                partial.unlink()
                have = 0
            with open(partial, "ab") as out:
                http_get(meta.location, out, resume_size=have, expected_size=size,
                         headers=build_hf_headers(token=token), displayed_filename=file.name)
        except FetchFailed:
            raise
        except Exception as exc:  # noqa: BLE001 - mapped to a message we write ourselves
            raise self._explain(exc, resolved.repo, resolved.revision) from None
        final.parent.mkdir(parents=True, exist_ok=True)
        os.replace(partial, final)

    def download_all(self, resolved: Resolved, staging: Path, workers: int = 4) -> None:
        """Every file not already finished in ``staging`` (partials under ``.fabric/partial/``),
        several at once as huggingface_hub's snapshot_download does. The first error is raised
        once the others have stopped; their partial files stay for the resume."""
        todo = [f for f in resolved.files if not _done(f, staging / f.name)]
        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            for _ in pool.map(lambda f: self.download(resolved, f, staging / ".fabric" / "partial" / f.name,
                                                      staging / f.name), todo):
                pass


def _done(file: RemoteFile, final: Path) -> bool:
    return final.exists() and (file.size is None or final.stat().st_size == file.size)


def stream_as_received(chunk_size: int | None = None) -> None:
    """Make ``http_get`` hand each body piece to the file as received (None), or regroup it into
    ``chunk_size`` bytes (the library's default is 10 MiB). ``http_get`` reads this module constant
    at each call (``response.iter_bytes(chunk_size=constants.DOWNLOAD_CHUNK_SIZE)``) and httpx's
    ``iter_bytes(None)`` yields the pieces as they come; process-wide, like the progress bars."""
    huggingface_hub.constants.DOWNLOAD_CHUNK_SIZE = chunk_size  # type: ignore[assignment]


def library_version() -> str:
    return huggingface_hub.__version__
