"""Maglev service routes: the whole backend set of one service, written to the BPF maps.

    PUT    /v1/maglev/services                       a batch: every service whose plan generation moved
    PUT    /v1/maglev/services/{vip}/{port}/{proto}  the whole backend set of one service
    GET    /v1/maglev/services[/{vip}/{port}/{proto}]
    DELETE /v1/maglev/services/{vip}/{port}/{proto}  404 when absent

Each single answer is read back from the dataplane: what the maps now hold, not what was asked.
Every write goes through ``state.services`` (agent.service_generations): a service older than the
generation held is refused, 409 ``stale_generation`` (in a batch: that service's outcome ``stale``,
the others applied), so a late PUT never overwrites a newer one.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response

from agent.service_generations import StaleGeneration
from agent.state import AgentState, as_dict
from common.agent_api import (
    MaglevBackendStats,
    MaglevBatchResult,
    MaglevPutResult,
    MaglevServiceBatch,
    MaglevServiceList,
    MaglevServiceSpec,
    MaglevServiceView,
    service_key,
)
from common.errors import FabricError, InvalidInput, NotFound, Refused


def _service_key(vip: str, port: int, proto: str) -> tuple[str, int, str]:
    try:
        ipaddress.IPv4Address(vip)
    except ValueError:
        raise InvalidInput(f"vip {vip!r} is not an IPv4 address") from None
    if not 1 <= port <= 65535:
        raise InvalidInput(f"port {port} is outside 1-65535")
    if proto not in ("tcp", "udp"):
        raise InvalidInput(f"proto {proto!r}: expected tcp or udp")
    return vip, port, proto


def _service_view(obj: Any, vip: str = "", port: int = 0, proto: str = "") -> MaglevServiceView:
    """A wire view from the dataplane's view: agent.dataplane.ServiceView (backends as a list of
    per-backend views with live counters) or a plain mapping {"backends": {addr: weight}}."""
    d = as_dict(obj)
    raw = d.get("backends", {})
    stats: list[MaglevBackendStats] = []
    if isinstance(raw, dict):
        backends = {str(k): int(v) for k, v in raw.items()}
        draining = sorted(str(b) for b in d.get("draining", ()))
    else:
        stats = [MaglevBackendStats.model_validate(as_dict(b)) for b in raw]
        backends = {b.address: b.weight for b in stats}
        draining = sorted(b.address for b in stats if b.draining)
    return MaglevServiceView(vip=str(d.get("vip", vip)), port=int(d.get("port", port)),
                             proto=d.get("proto", proto), backends=backends, draining=draining,
                             forwarding=d.get("forwarding", "nat"), stats=stats)


def maglev_router(state: AgentState) -> APIRouter:
    router = APIRouter()

    def _dataplane():
        if state.dataplane is None:
            raise Refused(f"the dataplane is not loaded on node {state.node_id}: "
                          f"{state.dataplane_message or 'started with --no-dataplane'}")
        return state.dataplane

    @router.get("/v1/maglev/services", response_model=MaglevServiceList)
    def list_services() -> MaglevServiceList:
        views = [_service_view(s) for s in _dataplane().list_services()]
        return MaglevServiceList(services=[v.model_copy(update={"generation": state.services.held(
            service_key(v.vip, v.port, v.proto))}) for v in views])

    def _put(vip: str, port: int, proto: str, spec: MaglevServiceSpec) -> bool:
        unknown = sorted(set(spec.draining) - set(spec.backends))
        if unknown:
            raise InvalidInput(f"draining names backends not in the set: {', '.join(unknown)}")
        dp = _dataplane()
        if state.fail_closed is not None:
            state.fail_closed.admit_put()  # 503 fail_closed while a fail-closed site is cut off
        return state.services.put(dp, vip, port, proto, spec)

    @router.put("/v1/maglev/services", response_model=MaglevBatchResult)
    def put_services(batch: MaglevServiceBatch) -> MaglevBatchResult:
        """Each service in order; one that fails says why and the others are applied all the same.
        Refused as a whole only when no service can be written here (no dataplane, fail-closed)."""
        _dataplane()
        if state.fail_closed is not None:
            state.fail_closed.admit_put()
        results, changed = [], False
        with state.services.batch():  # the generations file is written once, after the batch
            for s in batch.services:
                key = s.key
                try:
                    changed = _put(s.vip, s.port, s.proto, s.spec()) or changed
                except StaleGeneration as exc:
                    results.append(MaglevPutResult(key=key, generation=s.generation, outcome="stale",
                                                   held=exc.held, code=exc.code, message=exc.message))
                except FabricError as exc:
                    results.append(MaglevPutResult(key=key, generation=s.generation, outcome="failed",
                                                   held=state.services.held(key), code=exc.code,
                                                   message=exc.message))
                else:
                    results.append(MaglevPutResult(key=key, generation=s.generation, outcome="applied",
                                                   held=s.generation))
        if changed and state.bgp is not None:
            state.bgp.poke()  # announce or withdraw the VIPs now, not at the next pass
        return MaglevBatchResult(results=results)

    @router.put("/v1/maglev/services/{vip}/{port}/{proto}", response_model=MaglevServiceView)
    def put_service(vip: str, port: int, proto: str, spec: MaglevServiceSpec) -> MaglevServiceView:
        vip, port, proto = _service_key(vip, port, proto)
        dp = _dataplane()
        if _put(vip, port, proto, spec) and state.bgp is not None:
            state.bgp.poke()  # announce or withdraw the VIP now, not at the next pass
        written = dp.get_service(vip, port, proto)  # read back: what the maps now hold
        held = state.services.held(service_key(vip, port, proto))
        if written is not None:
            return _service_view(written, vip, port, proto).model_copy(update={"generation": held})
        return MaglevServiceView(vip=vip, port=port, proto=proto, backends=spec.backends,
                                 draining=sorted(spec.draining), generation=held)

    @router.get("/v1/maglev/services/{vip}/{port}/{proto}", response_model=MaglevServiceView)
    def get_service(vip: str, port: int, proto: str) -> MaglevServiceView:
        vip, port, proto = _service_key(vip, port, proto)
        view = _dataplane().get_service(vip, port, proto)
        if view is None:
            raise NotFound(f"service {vip}:{port}/{proto} is not in the dataplane")
        return _service_view(view, vip, port, proto).model_copy(
            update={"generation": state.services.held(service_key(vip, port, proto))})

    @router.delete("/v1/maglev/services/{vip}/{port}/{proto}", status_code=204)
    def delete_service(vip: str, port: int, proto: str) -> Response:
        vip, port, proto = _service_key(vip, port, proto)
        if not state.services.delete(_dataplane(), vip, port, proto):
            raise NotFound(f"service {vip}:{port}/{proto} is not in the dataplane")
        if state.bgp is not None:
            state.bgp.poke()
        return Response(status_code=204)

    return router
