"""What the dataplane reports about its services: pydantic, so the agent's HTTP
API and the CLI can return it as is."""

from __future__ import annotations

from pydantic import BaseModel


class BackendView(BaseModel):
    address: str  # "IP:PORT"
    weight: int
    draining: bool
    source_nat: bool
    slots: int  # Maglev slots in the active table
    share: float  # slots / table size
    packets: int  # forwarded packets (all CPUs)
    bytes: int


class ServiceView(BaseModel):
    vip: str
    port: int
    proto: str
    active_ring: int
    no_backends: bool
    backends: list[BackendView]
