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
    active_flows: int = 0  # flows in the connection table not yet ended (drains wait for 0)


class FlowMisses(BaseModel):
    syn: int = 0  # SYNs that picked a backend
    other: int = 0  # non-SYN packets (and UDP) that found no entry


class ServiceView(BaseModel):
    vip: str
    port: int
    proto: str
    active_ring: int
    no_backends: bool
    backends: list[BackendView]
    misses: FlowMisses = FlowMisses()
    forwarding: str = "nat"  # "nat" or "dsr-ipip"
