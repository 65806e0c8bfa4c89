"""The H100 80GB MIG catalog (profiles, their share of the GPU), shared by the API schemas and
the control plane's MIG decisions (controlplane/mig/catalog.py), and the slice record (MigSlice)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from pydantic import BaseModel, Field


@dataclass(frozen=True)
class MigProfile:
    name: str
    compute: int  # of 7 compute slices
    memory_gib: int
    max_instances: int


CATALOG: dict[str, MigProfile] = {p.name: p for p in (
    MigProfile("1g.10gb", 1, 10, 7),
    MigProfile("2g.20gb", 2, 20, 3),
    MigProfile("3g.40gb", 3, 40, 2),
    MigProfile("7g.80gb", 7, 80, 1),
)}
ALIASES = {name.split(".")[0]: name for name in CATALOG}  # 1g -> 1g.10gb ...
COMPUTE_SLICES = 7


def canonical_name(name: str) -> str:
    """The catalog name for NAME or an alias; ValueError naming the catalog otherwise."""
    key = ALIASES.get(name, name)
    if key not in CATALOG:
        names = ", ".join(p for n in CATALOG for p in (n, n.split(".")[0]))
        raise ValueError(f"MIG profile {name!r} is not in the H100 catalog ({names})")
    return key


class MigSlice(BaseModel):
    id: str
    node: str
    parent_bdf: str
    profile: str
    index: int
    compute: int
    memory_gib: int
    mode: str  # record | nvidia-smi
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    created_at: float = Field(default_factory=time.time)
