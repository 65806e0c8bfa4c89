"""Model supply chain records shared by fabricd and the agent.

A model job brings one model's bytes onto one node and checks them. Its states, in order:

    Registered -> Resolving -> Downloading -> Verifying -> Scanning -> Ready
                         \\-----------\\-------------\\-----------\\--> Failed (message, retries)

fabricd stores a ``ModelJob`` per (model, node) under ``keyspace.model_jobs`` and orders the
agent to run it (``AgentJobRequest``); the agent runs it, keeps its own durable record and
answers with an ``AgentJobView``; fabricd writes every state the agent passed through into the
store record (``history``). A local source skips Downloading. Secrets never appear here: the
Hugging Face token stays in the agent's environment.

A model's LoRA adapters travel with its job (``AgentJobRequest.adapters``): the agent fetches
and checks each one after the model, the same way (resolve, download, per-file hashes, digest,
scan), into the same cache, and the job is Ready only once all are; the view names each
adapter's digest (``adapters``), which the VM create passes on (``VmCreateRequest.adapter_digests``).
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from common.schemas import tenant_name

JobState = Literal["Registered", "Resolving", "Downloading", "Verifying", "Scanning", "Ready", "Failed"]
JOB_STATES: tuple[str, ...] = ("Registered", "Resolving", "Downloading", "Verifying", "Scanning", "Ready", "Failed")
TERMINAL = ("Ready", "Failed")
DIGEST = re.compile(r"^[0-9a-f]{64}$")
# Job ids become file names on the agent: MODEL.NODE, both DNS labels.
JOB_ID = re.compile(r"^[a-z0-9][a-z0-9.-]{0,127}$")
# Adapter names become directory names in the guest's /adapters: DNS labels only.
ADAPTER_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
MAX_ADAPTERS = 256


def check_adapter_name(value: str) -> str:
    if not ADAPTER_NAME.match(value):
        raise ValueError(f"adapter name {value!r}: expected a DNS label (lowercase letters, digits, '-')")
    return value


def check_digest(value: str | None) -> str | None:
    if value is not None and not DIGEST.match(value):
        raise ValueError(f"digest {value!r}: expected 64 lowercase hex characters (SHA-256)")
    return value


def job_id(model: str, node: str) -> str:
    return f"{model}.{node}"


class Transition(BaseModel):
    state: JobState
    at: float
    message: str = ""


class AdapterSource(BaseModel):
    """One LoRA adapter of the job's model: fetched and checked like the model, after it."""

    model_config = ConfigDict(extra="forbid")
    name: str
    source: str = Field(..., min_length=1, max_length=1024)
    revision: str | None = Field(None, max_length=200, description="commit sha once resolved by another node")
    expected_digest: str | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return check_adapter_name(v)

    @field_validator("expected_digest")
    @classmethod
    def _digest(cls, v: str | None) -> str | None:
        return check_digest(v)


class AdapterFetched(BaseModel):
    """An adapter's verified bytes on the node: its digest directory in the cache."""

    source: str
    digest: str
    revision: str | None = None
    size_bytes: int = 0
    files: int = 0


class AgentJobRequest(BaseModel):
    """What fabricd asks an agent to materialize (POST /v1/models/jobs; idempotent by id+attempt)."""

    model_config = ConfigDict(extra="forbid")
    job_id: str
    attempt: int = Field(0, ge=0)
    model: str
    source: str = Field(..., min_length=1, max_length=1024)
    revision: str | None = Field(None, max_length=200, description="commit sha once resolved by another node")
    expected_digest: str | None = None
    require_checksum: bool = False
    signature: str | None = Field(None, max_length=128)
    size_bytes: int | None = Field(None, ge=0)
    adapters: list[AdapterSource] = Field(default_factory=list, max_length=MAX_ADAPTERS)
    tenant: str | None = Field(None, description="the model's tenant: its local sources must lie in that "
                               "tenant's root, and the cache keeps them apart from other tenants'")

    @field_validator("tenant")
    @classmethod
    def _tenant(cls, v: str | None) -> str | None:
        return None if v is None else tenant_name(v)

    @field_validator("adapters")
    @classmethod
    def _adapters(cls, v: list[AdapterSource]) -> list[AdapterSource]:
        if len({a.name for a in v}) != len(v):
            raise ValueError("adapter names must be unique")
        return v

    @field_validator("job_id")
    @classmethod
    def _id(cls, v: str) -> str:
        if not JOB_ID.match(v):
            raise ValueError(f"job id {v!r}: expected lowercase letters, digits, '.' or '-'")
        return v

    @field_validator("expected_digest")
    @classmethod
    def _digest(cls, v: str | None) -> str | None:
        return check_digest(v)


class AgentJobView(BaseModel):
    """An agent's view of one job (its durable record plus live progress)."""

    job_id: str
    attempt: int = 0
    state: JobState = "Registered"
    message: str = ""
    revision: str | None = None
    digest: str | None = None
    path: str | None = None
    bytes_done: int = 0
    bytes_total: int = 0
    files: int = 0
    safetensors: int = 0
    retries: int = Field(0, description="transient fetch errors retried in this attempt")
    joined: str | None = Field(None, description="the job whose download this one follows")
    adapters: dict[str, AdapterFetched] = Field(default_factory=dict, description="adapter name -> its bytes")
    history: list[Transition] = Field(default_factory=list)


class CacheEntry(BaseModel):
    digest: str
    size_bytes: int
    last_used: float
    path: str
    local: bool = Field(False, description="a local source under FABRIC_MODEL_DIR: never deleted")


class CacheList(BaseModel):
    entries: list[CacheEntry] = Field(default_factory=list)
    free_bytes: int = 0


class VerifyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    digest: str
    expected_digest: str | None = None
    require_checksum: bool = False
    signature: str | None = None

    @field_validator("digest", "expected_digest")
    @classmethod
    def _digest(cls, v: str | None) -> str | None:
        return check_digest(v)


class VerifyResult(BaseModel):
    ok: bool
    digest: str
    message: str


class ModelJob(BaseModel):
    """fabricd's record of one job: /fabric/model-jobs/{model}/{node}."""

    model: str
    node: str
    state: JobState = "Registered"
    message: str = "job recorded; waiting for the agent"
    attempt: int = 0
    retries: int = 0
    revision: str | None = None
    digest: str | None = None
    path: str | None = None
    bytes_done: int = 0
    bytes_total: int = 0
    files: int = 0
    joined: str | None = None
    adapters: dict[str, AdapterFetched] = Field(default_factory=dict)
    history: list[Transition] = Field(default_factory=list)
    created_at: float = Field(default_factory=time.time)
    updated_at: float = Field(default_factory=time.time)

    @property
    def id(self) -> str:
        return job_id(self.model, self.node)

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL


def retried(job: ModelJob, reason: str, now: float) -> ModelJob:
    """A new attempt of the job (Registered again, attempt and retries + 1)."""
    return job.model_copy(update={
        "state": "Registered", "message": reason, "attempt": job.attempt + 1, "retries": job.retries + 1,
        "bytes_done": 0, "joined": None, "digest": None, "path": None, "adapters": {}, "updated_at": now,
        "history": [*job.history, {"state": "Registered", "at": now, "message": reason}]})


def amount(done: int, total: int) -> str:
    """``3.1/16.4 GiB`` (MiB below 1 GiB, KiB below 1 MiB)."""
    unit, div = next((u, d) for u, d in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)) if total >= d or u == "KiB")
    return f"{done / div:.1f}/{total / div:.1f} {unit}"


def progress_text(model: str, state: str, done: int, total: int, message: str = "") -> str:
    """One line for a replica waiting on its model, ending with what to run:
    ``model demo: Downloading 3.1/16.4 GiB; watch: fabricctl ai model status demo``."""
    if state == "Failed":
        return (f"model {model}: Failed: {message}; once fixed, fetch it again: "
                f"fabricctl ai model materialize {model}")
    shown = f"{state} {amount(done, total)}" if state in ("Downloading", "Verifying") and total else state
    return f"model {model}: {shown}; watch: fabricctl ai model status {model}"


TENANT_ROOTS = "tenants"  # {FABRIC_MODEL_DIR}/tenants/<tenant>/: a tenant's own local sources


def tenant_root(model_dir: str, tenant: str) -> str:
    import os

    return os.path.join(model_dir, TENANT_ROOTS, tenant_name(tenant))


def local_source_path(source: str, model_dir: str, tenant: str | None = None) -> str:
    """The canonical directory of a local source (``file:///srv/models/x`` or ``/srv/models/x``):
    its realpath, which must be ``model_dir`` (with ``tenant``: that tenant's root under it) or
    under it. The path must be written under the model dir and no part of it below the model
    dir may be a symlink, so neither ``/srv/models/../../etc`` nor a link from one tenant's root
    into another's (or out) is followed. fabricd checks this when a source is registered and the
    agent again before it hashes. Raises ValueError naming the paths."""
    import os

    raw = source.removeprefix("file://")
    if not raw.startswith("/"):
        raise ValueError(f"local source {source!r} is not an absolute path")
    norm = os.path.normpath(raw)
    for base in dict.fromkeys((os.path.normpath(model_dir), os.path.realpath(model_dir))):
        if norm == base or norm.startswith(base.rstrip("/") + "/"):
            below = Path(base)
            for part in Path(norm).relative_to(base).parts:
                below = below / part
                if below.is_symlink():
                    raise ValueError(f"local source {source!r} goes through a symlink ({below}); symlinks under "
                                     "FABRIC_MODEL_DIR are not followed")
            break
    else:
        raise ValueError(f"local source {source!r} lies outside FABRIC_MODEL_DIR ({model_dir})")
    real = os.path.realpath(raw)
    root = os.path.realpath(model_dir if tenant is None else tenant_root(model_dir, tenant))
    if real != root and not real.startswith(root.rstrip("/") + "/"):
        where = "FABRIC_MODEL_DIR" if tenant is None else f"the model root of tenant {tenant}"
        raise ValueError(f"local source {source!r} resolves to {real}, outside {where} ({root})")
    return real
