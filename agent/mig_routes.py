"""The agent's MIG routes (agent/hw/mig.py does the work), refused unless FABRIC_PCI_MIG=1.

    POST   /v1/gpus/{bdf}/mig              {"profile": "1g.10gb"} -> {"gpu_instance_id", "compute_instance_id"}
    DELETE /v1/gpus/{bdf}/mig/{gi}/{ci}    destroy that compute instance and its GPU instance
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field, field_validator

from agent.hw.mig import MigRunner, NvidiaSmiMig
from common.agent_api import check_bdf
from common.errors import InvalidInput, Refused
from common.mig_catalog import canonical_name


class MigCreateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    profile: str = Field(..., max_length=16)

    @field_validator("profile")
    @classmethod
    def _profile(cls, v: str) -> str:
        return canonical_name(v)


class MigInstanceView(BaseModel):
    bdf: str
    profile: str | None = None
    gpu_instance_id: int
    compute_instance_id: int


def mig_router(runner: MigRunner | None = None, *, is_enabled: Callable[[], bool]) -> APIRouter:
    """is_enabled: the agent's FABRIC_PCI_MIG (AgentState.settings.pci_mig), asked per call."""
    router = APIRouter(prefix="/v1/gpus")
    runner = runner or NvidiaSmiMig()

    def _checked(bdf: str) -> str:
        if not is_enabled():
            raise Refused("this agent does not manage MIG: start it with FABRIC_PCI_MIG=1", code="pci_mig_disabled")
        try:
            return check_bdf(bdf)
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None

    @router.post("/{bdf}/mig", response_model=MigInstanceView, status_code=201)
    def create(bdf: str, req: MigCreateRequest) -> MigInstanceView:
        made = runner.create(_checked(bdf), req.profile)
        return MigInstanceView(bdf=bdf, profile=req.profile, gpu_instance_id=made.gpu_instance_id,
                               compute_instance_id=made.compute_instance_id)

    @router.delete("/{bdf}/mig/{gi}/{ci}", status_code=204)
    def destroy(bdf: str, gi: int, ci: int) -> None:
        runner.destroy(_checked(bdf), gi, ci)

    return router
