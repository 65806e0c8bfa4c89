"""Builds a GatewayApp from settings and a store: the one place the gateway's parts are wired."""

from __future__ import annotations

import ssl

from common.http1_client import UpstreamPool
from common.store.base import Store
from gateway.app import GatewayApp, GatewayState
from gateway.audit import AuditWriter
from gateway.bands import QueuePolicy, WaitingRoom
from gateway.capacity import Saturation
from gateway.cold_start import ColdStart
from gateway.dispatch import Dispatcher
from gateway.external import ExternalRouter
from gateway.key_auth import Authenticator
from gateway.limits import LimitKeeper, window_clock
from gateway.metrics import GatewayMetrics
from gateway.model_routing import CatalogueCache
from gateway.oidc import OidcVerifier
from gateway.oidc_access import OidcAccess
from gateway.replica_router import ReplicaRouter
from gateway.settings import BackendTls, GatewaySettings
from gateway.slots import SlotHolder
from gateway.telemetry import Tracer
from gateway.tenant_caps import TenantCaps
from gateway.upstreams import UpstreamCache
from gateway.usage import UsageCounter
from gateway.usage_ledger import UsageLedger


def backend_ssl(tls: BackendTls) -> ssl.SSLContext | bool:
    """The verify argument for upstream connections: the process trust store unless a CA is set."""
    if not tls.enabled:
        return True
    ctx = ssl.create_default_context(cafile=tls.ca) if tls.ca else ssl.create_default_context()
    if tls.client_cert and tls.client_key:
        ctx.load_cert_chain(tls.client_cert, tls.client_key)
    return ctx


def _kv_source(settings: GatewaySettings, store: Store, upstreams: UpstreamCache, tls: ssl.SSLContext | None,
               metrics: GatewayMetrics, gateway_id: str):
    """The agents' KV index for precise prefix routing (gateway/kv_source.py): tokenizers from
    the agents' model caches, FABRIC_GATEWAY_KV_TOKENIZERS=DIR overriding them per deployment,
    ``off`` for approximate routing only. The agents must admit the gateway's certificate CN."""
    if settings.kv_tokenizers == "off":
        return None
    from pathlib import Path

    import httpx

    from gateway.kv_blind import BlindWatch, store_event_writer
    from gateway.kv_source import AgentKvSource

    if settings.kv_agent_tls.enabled:  # FABRIC_GATEWAY_KV_CLIENT_*: the agents' own client certificate
        tls = backend_ssl(settings.kv_agent_tls)  # type: ignore[assignment]
    client = httpx.AsyncClient(verify=tls if tls is not None else True, timeout=1.0)
    blind = BlindWatch.exported(metrics.registry, store_event_writer(store, gateway_id))
    return AgentKvSource(upstreams, client, Path(settings.kv_tokenizers) if settings.kv_tokenizers else None,
                         blind=blind)


def upstream_pool(settings: GatewaySettings, ctx: ssl.SSLContext | None = None) -> UpstreamPool:
    """The proxy's upstream client (common.http1_client): keep-alive sockets per host:port,
    TCP_NODELAY, connect timeout 5 s, the idle timeout between chunks from settings. Idle sockets
    are dropped after 4 s, under uvicorn's (and so vLLM's) 5 s keep-alive, so a reused socket is
    rarely one the upstream is closing. ctx: the TLS context create_app built once (None: made here)."""
    if ctx is None:
        made = backend_ssl(settings.backend_tls)
        ctx = made if isinstance(made, ssl.SSLContext) else None
    if settings.upstream_client == "aiohttp":  # the side-by-side measurement (scripts/bench-gateway)
        from gateway.upstream_aiohttp import AiohttpPool

        return AiohttpPool(ctx, connect_timeout=5.0,
                           idle_timeout=settings.idle_secs, keepalive_secs=4.0)
    return UpstreamPool(ctx, connect_timeout=5.0,
                        idle_timeout=settings.idle_secs, keepalive_secs=4.0)


def dispatcher(settings: GatewaySettings, upstreams: UpstreamCache, metrics: GatewayMetrics,
               slots: SlotHolder | None = None) -> Dispatcher:
    """Spillover, fallbacks and (with a saturation measure) the priority bands' waiting room, which
    holds this process's share of the band bounds among the live gateways (``slots``' leases)."""
    measure = Saturation(settings.saturation_queue, settings.saturation_kv)
    room = None
    if measure.measured:
        policy = QueuePolicy(settings.band_queue, settings.band_total, settings.band_ttl_secs)
        room = WaitingRoom(policy, on_displaced=lambda ep: metrics.count(metrics.displaced, ep),
                           on_depth=metrics.waiting_in,
                           gateways=slots.live_count_async if slots is not None else None)
    return Dispatcher(upstreams, measure, room, on_spill=lambda ep: metrics.count(metrics.spilled, ep),
                      on_fallback=lambda ep: metrics.count(metrics.fallbacks, ep))


def create_app(settings: GatewaySettings, store: Store, hmac_secret: bytes, gateway_id: str) -> GatewayApp:
    metrics = GatewayMetrics.create(multiprocess=settings.metrics_multiprocess)
    made = backend_ssl(settings.backend_tls)  # once per process: HTTP pool and WebSocket bridge
    tls = made if isinstance(made, ssl.SSLContext) else None
    upstreams = UpstreamCache(store, ttl_secs=settings.cache_ttl_secs)
    oidc = OidcVerifier(settings.oidc_providers, settings.accept_any_jwt_audience, settings.oidc_endpoints_claim)
    slots = SlotHolder(store, gateway_id, settings.slot_lease_secs)
    state = GatewayState(
        settings=settings,
        store=store,
        auth=Authenticator(store, hmac_secret, oidc, ttl_secs=settings.cache_ttl_secs,
                           access=OidcAccess(store, settings.cache_ttl_secs, settings.oidc_tenant_endpoints)),
        limits=LimitKeeper(store, slots, UsageCounter(store), shadow=settings.shadow_limits,
                           clock=window_clock(settings.clock_file)),
        upstreams=upstreams,
        audit=AuditWriter(store, on_drop=metrics.audit_drop),
        metrics=metrics,
        client=upstream_pool(settings, tls),
        backend_ssl=tls,
        tracer=Tracer(settings.otel_endpoint),
        gateway_id=gateway_id,
        cold_start=ColdStart(store, upstreams, hold=settings.hold),
        catalogue=CatalogueCache(store, ttl_secs=settings.cache_ttl_secs),
        ledger=(UsageLedger(store, gateway_id, on_drop=metrics.usage_drop, cache_ttl_s=settings.cache_ttl_secs)
                if settings.usage_ledger else None),
        router=ReplicaRouter(explain_ttl=settings.explain_secs, kv=_kv_source(settings, store, upstreams, tls, metrics, gateway_id)),
        dispatcher=dispatcher(settings, upstreams, metrics, slots),
        external=ExternalRouter(settings.idle_secs, settings.provider_key_dir, on_key_state=metrics.key_state),
        tenant_caps=TenantCaps(store, ttl_secs=settings.cache_ttl_secs),
    )
    return GatewayApp(state)
