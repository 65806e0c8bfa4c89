"""Builds a GatewayApp from settings and a store: the one place the gateway's parts are wired."""

from __future__ import annotations

import socket
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


class UpstreamClients:
    """A few pooled httpx clients used in turn. httpcore's pool rescans every connection it holds
    (a poll() per idle socket) for each request, so one pool of 64+ connections spends most of
    the gateway's CPU there at concurrency 64; shards keep each scan short."""

    def __init__(self, settings: GatewaySettings, shards: int = 16):
        self._clients = [upstream_client(settings) for _ in range(shards)]
        self._next = 0

    def pick(self) -> httpx.AsyncClient:
        self._next = (self._next + 1) % len(self._clients)
        return self._clients[self._next]

    async def aclose(self) -> None:
        for c in self._clients:
            await c.aclose()


def upstream_client(settings: GatewaySettings) -> httpx.AsyncClient:
    verify = backend_ssl(settings.backend_tls)
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=32, keepalive_expiry=30)
    # TCP_NODELAY: httpx writes headers and body separately; with Nagle the body waits for the
    # peer's delayed ACK (about 4 ms even on loopback) on every call.
    transport = httpx.AsyncHTTPTransport(verify=verify, limits=limits,
                                         socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
    return httpx.AsyncClient(
        transport=transport,
        timeout=httpx.Timeout(connect=5.0, read=settings.idle_secs, write=30.0, pool=30.0),
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
        client=UpstreamClients(settings),
        tracer=Tracer(settings.otel_endpoint),
        gateway_id=gateway_id,
    )
    return GatewayApp(state)
