"""Builds a GatewayApp from settings and a store: the one place the gateway's parts are wired."""

from __future__ import annotations

import ssl

import httpx

from common.store.base import Store
from gateway.app import GatewayApp, GatewayState
from gateway.audit import AuditWriter
from gateway.key_auth import Authenticator
from gateway.limits import LimitKeeper
from gateway.metrics import GatewayMetrics
from gateway.oidc import OidcVerifier
from gateway.settings import BackendTls, GatewaySettings
from gateway.telemetry import Tracer
from gateway.upstreams import UpstreamCache


def backend_ssl(tls: BackendTls) -> ssl.SSLContext | bool:
    """The verify argument for upstream connections: the process trust store unless a CA is set."""
    if not tls.enabled:
        return True
    ctx = ssl.create_default_context(cafile=tls.ca) if tls.ca else ssl.create_default_context()
    if tls.client_cert and tls.client_key:
        ctx.load_cert_chain(tls.client_cert, tls.client_key)
    return ctx


def upstream_client(settings: GatewaySettings) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        verify=backend_ssl(settings.backend_tls),
        timeout=httpx.Timeout(connect=5.0, read=settings.idle_secs, write=30.0, pool=30.0),
        limits=httpx.Limits(max_connections=1024, max_keepalive_connections=256, keepalive_expiry=30),
        follow_redirects=False,
        trust_env=False,  # a proxy variable in the environment must not reroute inference traffic
    )


def create_app(settings: GatewaySettings, store: Store, hmac_secret: bytes, gateway_id: str) -> GatewayApp:
    state = GatewayState(
        settings=settings,
        store=store,
        auth=Authenticator(store, hmac_secret, OidcVerifier(settings.oidc_providers, settings.accept_any_jwt_audience),
                           ttl_secs=settings.cache_ttl_secs),
        limits=LimitKeeper(store),
        upstreams=UpstreamCache(store, ttl_secs=settings.cache_ttl_secs),
        audit=AuditWriter(store),
        metrics=GatewayMetrics.create(),
        client=upstream_client(settings),
        tracer=Tracer(settings.otel_endpoint),
        gateway_id=gateway_id,
    )
    return GatewayApp(state)
