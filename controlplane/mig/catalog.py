"""The H100 MIG catalog and the pure decisions about slices.

A slice is a record `MigSlice` under keyspace.mig_slices(node, id), id ``PARENT--PROFILE--N``
(``0000:3b:00.0--1g.10gb--0``). Profiles are H100 80GB's: 1g.10gb, 2g.20gb, 3g.40gb, 7g.80gb
(also written 1g, 2g, 3g, 7g). A new slice must still fit its parent: its compute slices and
memory added to the parent's existing slices stay within 7 compute slices and the parent's
memory (and each profile's instance limit: 7, 3, 2, 1).

How a slice is made depends on the parent (``mode``):
  record          the node's GPUs are simulated (lab or dry-run driver): a record only, always;
  refuse          a real PCI GPU without FABRIC_PCI_MIG=1: 400;
  record          a PCI GPU with FABRIC_PCI_MIG=1 and FABRIC_PCI_MIG_RECORD_ONLY=1 (no driver);
  nvidia-smi      a PCI GPU with FABRIC_PCI_MIG=1: the agent runs `nvidia-smi mig -cgi P -C`
                  (and destroys the instances on delete).
A slice held by a replica (a GPU reservation on its id) cannot be deleted.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from common.errors import Conflict, InvalidInput, NotFound, Refused
from common.mig_catalog import CATALOG, COMPUTE_SLICES, MigProfile, MigSlice, canonical_name
from common.schemas import Node

SIMULATED_DRIVERS = ("lab", "dry-run")


def canonical_profile(name: str) -> MigProfile:
    try:
        return CATALOG[canonical_name(name)]
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None


class MigCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    parent_bdf: str = Field(..., min_length=1, max_length=64)
    profile: str = Field(..., min_length=1, max_length=16)


class MigProfileBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    profile: str = Field(..., min_length=1, max_length=16)


@dataclass(frozen=True)
class MigSettings:
    pci_mig: bool = False
    record_only: bool = False
    # FABRIC_PCI_MIG and FABRIC_PCI_MIG_RECORD_ONLY, read and checked by controlplane.settings.load


def slice_id(parent: str, profile: str, index: int) -> str:
    return f"{parent}--{profile}--{index}"


def mode_for(node: Node, settings: MigSettings) -> str:
    if node.vm_driver in SIMULATED_DRIVERS:
        return "record"
    if not settings.pci_mig:
        raise Refused(f"node {node.id} has real PCI GPUs: MIG slices on them need FABRIC_PCI_MIG=1 on fabricd "
                      "(and FABRIC_PCI_MIG_RECORD_ONLY=1 to record them without the driver)", code="pci_mig_disabled")
    return "record" if settings.record_only else "nvidia-smi"


def plan_create(node: Node, parent_bdf: str, profile_name: str, existing: list[MigSlice],
                settings: MigSettings, now: float) -> MigSlice:
    """The new slice (not yet stored), or a 4xx naming why not."""
    profile = canonical_profile(profile_name)
    parent = next((g for g in node.gpus if g.pci == parent_bdf), None)
    if parent is None:
        raise NotFound(f"node {node.id} has no GPU {parent_bdf!r}")
    mode = mode_for(node, settings)
    mine = [s for s in existing if s.parent_bdf == parent_bdf]
    same = [s for s in mine if s.profile == profile.name]
    if len(same) >= profile.max_instances:
        raise Conflict(f"GPU {parent_bdf} already has {len(same)} {profile.name} slices (at most "
                       f"{profile.max_instances})", code="mig_full")
    compute = sum(s.compute for s in mine) + profile.compute
    memory = sum(s.memory_gib for s in mine) + profile.memory_gib
    parent_gib = parent.memory_total_mib / 1024
    if compute > COMPUTE_SLICES or memory > parent_gib + 0.5:
        raise Conflict(f"{profile.name} does not fit GPU {parent_bdf}: its slices would use {compute}/"
                       f"{COMPUTE_SLICES} compute slices and {memory} of {parent_gib:.0f} GiB", code="mig_full")
    used = {s.index for s in same}
    index = next(i for i in range(profile.max_instances) if i not in used)
    return MigSlice(id=slice_id(parent_bdf, profile.name, index), node=node.id, parent_bdf=parent_bdf,
                    profile=profile.name, index=index, compute=profile.compute, memory_gib=profile.memory_gib,
                    mode=mode, created_at=now)


def check_delete(slice_: MigSlice, holder: str | None) -> None:
    if holder:
        raise Conflict(f"MIG slice {slice_.id} is held by replica {holder}; drain or scale it away first",
                       code="in_use")
