"""The gateway as a raw ASGI app: the hot path skips a framework's routing and validation layers.

Routes:
  /api/ai/openai/{endpoint}/{path...}   the OpenAI proxy (HTTP, or WebSocket when upgraded)
  /metrics                              Prometheus text
  /health                               liveness
A call passes named stages, each a method of GatewayApp with its invariant in its docstring,
carrying one CallState (gateway.call_state); nothing an unauthenticated caller sends is read
before the credential:
  authenticate  one decoding of the raw path (gateway.routes), the credential from the headers (a
                refusal is audited and answered with Connection: close, body unread)
  read          the body, streaming under the route's cap, parsed the way the engine will (off the
                event loop when large)
  resolve       the key's model scope, ATTEMPT audited, the endpoint and its view (only then is its
                name a metric label; a cold endpoint holds the call)
  admit         shed, dispatch's pool, caps, the usage budget
  pick          the target, by one of the pickers of gateway.pickers (external, adapter, scored,
                affinity), explained
  reserve       the batch scope, the limits' reservation
  forward       proxy -- or, in dry run, answer synthetically having applied every check and limit
  finish        tokens settled, slots freed and SUCCESS/FAILED audited, in a finally that a
                disconnect cannot skip
"""

from __future__ import annotations

import asyncio
import gc
import hmac
import itertools
import json
import logging
import os
import ssl
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST

from common.errors import FabricError, Forbidden, InvalidInput, LimitExceeded, NotFound
from common.health import healthz_body
from common.process_memory import reclaim_every
from common.store.base import Store
from common.usage_ledger import Dims
from gateway import batch_scope, dry_run
from gateway.adapters import AdapterRouter
from gateway.audit import AuditWriter
from gateway.bands import QueueRefused
from gateway.cache_salt import salted
from gateway.call_state import CallState
from gateway.cold_start import ColdStart
from gateway.deadlines import Deadlines
from gateway.dispatch import Dispatcher, Placement, needed
from gateway.external import ExternalRouter
from gateway.hold import HeldStream
from gateway.http_io import (
    ClientGone,
    outcome_of,
    read_body,
    request_headers,
    request_timeout,
    run_unless_client_leaves,
    send_error,
    send_json,
)
from gateway.key_auth import Authenticator, Identity, check_model, presented_id
from gateway.limits import Admission, LimitKeeper, RequestFacts, check_caps, key_shadowed, plan_admission
from gateway.live_budget import live_budget
from gateway.metrics import GatewayMetrics
from gateway.model_routing import CatalogueCache, endpoint_without_model, models_page, resolve, visible_models
from gateway.pickers import (
    AdapterPicker,
    AffinityPicker,
    ExternalPicker,
    Pickers,
    PickInput,
    ScoredPicker,
    replica_urls,
)
from gateway.proxy import UpstreamBroke, UpstreamTimeout, VipConnections, forward, upstream_headers
from gateway.readiness import readiness, store_failure
from gateway.replica_router import ReplicaRouter
from gateway.request_body import BodyInfo, GenerationPolicy, parse_body, with_field
from gateway.routes import PREFIX, Route, check_served, is_root, parse_route
from gateway.settings import GatewaySettings
from gateway.stream_migration import Deaths, EndpointQuota, Migration, refusal
from gateway.telemetry import Tracer
from gateway.tenant_caps import TenantCaps, tighter
from gateway.upstreams import UpstreamCache, check_shed, replica_target
from gateway.usage_inject import UsageStripper, fallback_tokens, inject
from gateway.usage_ledger import Call, UsageLedger, split

if TYPE_CHECKING:
    from common.http1_client import UpstreamPool

log = logging.getLogger("fabric.gateway")
PRIORITIES = ("low", "normal", "high")


class BodyTimeout(FabricError):
    status = 408
    code = "body_timeout"


OFF_LOOP_BYTES = 64 * 1024  # bodies above this are parsed in a thread, not on the event loop
ROUTE_CACHE_MAX = 4096
ROUTE_CACHE_PATH_MAX = 512  # longer raw paths are parsed every time, never kept
UPLOAD_DEADLINE_S = 600.0  # a /v1/files upload (up to FABRIC_GATEWAY_MAX_UPLOAD); others: settings.body_secs
# /health and /healthz: the shape every Fabric process shares (common.health), made once.
HEALTHZ = json.dumps(healthz_body("fabric-gateway")[1]).encode()
EXPLAIN = "/api/ai/explain/request/"
GUARD = "fabric.disconnect_guard"  # gateway.http_server's: cancels the call when the client leaves
_NONE: dict = {}
GC_GEN0_THRESHOLD = 20_000  # net allocations between young collections (Python's default: 700)


def metrics_allowed(token: str | None, raw_headers) -> bool:
    """/metrics is open unless FABRIC_METRICS_TOKEN is set; then it needs that bearer token."""
    if not token:
        return True
    sent = next((v for k, v in raw_headers if k == b"authorization"), b"")
    return hmac.compare_digest(sent, b"Bearer " + token.encode())


def call_band(asked: str | None, key_priority: str | None) -> str:
    """A call's band: its x-request-priority, never above its key's priority (a ceiling; a key
    without one, or an OIDC caller, tops out at normal); no header: the key's priority."""
    ceiling = key_priority or "normal"
    if asked is None:
        return ceiling
    if (asked := asked.lower()) not in PRIORITIES:
        raise InvalidInput("x-request-priority must be low, normal or high")
    return min(asked, ceiling, key=PRIORITIES.index)


@dataclass
class GatewayState:
    settings: GatewaySettings
    store: Store
    auth: Authenticator
    limits: LimitKeeper
    upstreams: UpstreamCache
    audit: AuditWriter
    metrics: GatewayMetrics
    client: UpstreamPool
    tracer: Tracer
    gateway_id: str
    cold_start: ColdStart | None = None  # records demand and holds/refuses with no ready replica
    catalogue: CatalogueCache | None = None  # the root /v1: model -> endpoint (gateway.model_routing)
    router: ReplicaRouter = field(default_factory=ReplicaRouter)  # routing_l7 choices and their explanations
    ledger: UsageLedger | None = None  # usage records and budgets (gateway.usage_ledger); None: off
    dispatcher: Dispatcher | None = None  # spillover, bands, fallbacks (gateway.dispatch)
    external: ExternalRouter = field(default_factory=ExternalRouter)  # provider keys and breakers
    adapters: AdapterRouter = field(default_factory=AdapterRouter)  # LoRA adapters loaded per replica
    vip_connections: VipConnections = field(default_factory=VipConnections)  # retired when a replica leaves
    tenant_caps: TenantCaps | None = None  # a tenant's max_context_tokens (gateway.tenant_caps)
    # The upstream TLS context, built once from settings.backend_tls (gateway.assemble) and shared by
    # the HTTP pool and the WebSocket bridge; None: plain HTTP/WS to the replicas.
    backend_ssl: ssl.SSLContext | None = None

    @property
    def scheme(self) -> str:
        return "https" if self.settings.backend_tls.enabled else "http"

    @property
    def generation(self) -> GenerationPolicy:
        s = self.settings
        return GenerationPolicy(s.default_max_tokens, s.max_generated_tokens, s.max_context)


def quiet_gc() -> None:
    """Move everything made at start (modules, settings, pydantic and prometheus objects) out of
    the collector's reach and collect the young generations less often. Measured at 64 clients:
    one full collection scanning the start-up heap paused the loop 77 ms (every call in flight
    waits it out: the p99), and young collections ran about every 80 calls."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_GEN0_THRESHOLD, 20, 20)


class GatewayApp:
    def __init__(self, state: GatewayState):
        self.state = state
        # Request ids: a random per-process prefix and a counter (uuid4 costs a getrandom()
        # syscall per call, which was ~8% of the hot path's CPU). Same 32-hex-character shape.
        self._id_prefix = os.urandom(8).hex()
        self._id_seq = itertools.count(1)
        self._routes: dict[tuple[bytes, str], Route] = {}
        self._calls: dict[str, int] = {}  # credential subject -> its calls in progress here
        self._deadlines = Deadlines()  # the upstream call's deadline: no event-loop timer per call
        self._trimmer: asyncio.Task | None = None
        self._moves = EndpointQuota(state.settings.migrations_per_endpoint)  # gateway.stream_migration
        self._deaths = Deaths()  # replicas that died under streams here
        self._pickers = Pickers(  # where a call goes (gateway.pickers)
            ExternalPicker(),
            AdapterPicker(state.adapters, state.client, state.router, state.dispatcher, state.scheme),
            ScoredPicker(state.router, state.scheme),
            AffinityPicker(state.vip_connections, state.client, state.scheme))

    async def __call__(self, scope, receive, send) -> None:
        kind = scope["type"]
        if kind == "http":
            path = scope["path"]
            if path.startswith(PREFIX) or is_root(path):
                await self.call(scope, receive, send)
            elif path == "/metrics":
                if not metrics_allowed(self.state.settings.metrics_token, scope["headers"]):
                    await send_json(send, 401, b'{"error":{"code":"no_token","message":"/metrics needs '
                                               b'Authorization: Bearer FABRIC_METRICS_TOKEN","type":"no_token"}}')
                    return
                if self.state.metrics.store_up is not None:
                    self.state.metrics.store_up.set(0 if await store_failure(self.state.store) else 1)
                age = self.state.upstreams.readings_age()
                if self.state.metrics.readings_age is not None:  # NaN before the first refresh
                    self.state.metrics.readings_age.set(float("nan") if age is None else age)
                body = self.state.metrics.exposition()
                await send({"type": "http.response.start", "status": 200,
                            "headers": [(b"content-type", CONTENT_TYPE_LATEST.encode())]})
                await send({"type": "http.response.body", "body": body})
            elif path.startswith(EXPLAIN):
                await self.explain(scope, send)
            elif path in ("/health", "/healthz"):
                await send_json(send, 200, HEALTHZ)
            elif path in ("/ready", "/readyz"):  # the store reachable: limits enforceable (gateway.readiness)
                await send_json(send, *await readiness(self.state.store))
            else:
                await send_json(send, 404, b'{"error":{"code":"not_found","message":"no such route","type":"not_found"}}')
        elif kind == "websocket":
            from gateway.websocket_bridge import bridge

            await bridge(self.state, scope, receive, send)
        elif kind == "lifespan":
            await self.lifespan(receive, send)

    async def lifespan(self, receive, send) -> None:
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                self.state.metrics.runtime.bind()
                quiet_gc()
                await asyncio.to_thread(self.state.limits.slots.register)
                self.state.limits.slots.start_renewing()
                if self.state.settings.reclaim_secs:  # cyclic garbage, malloc's free pages (docs/reliability.md)
                    self._trimmer = asyncio.create_task(reclaim_every(self.state.settings.reclaim_secs))
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await self.state.limits.slots.stop()
                if self._trimmer is not None:
                    self._trimmer.cancel()
                await self.state.auth.oidc.jwks.close()
                self.state.client.close()
                self.state.upstreams.close()
                self.state.external.close()
                self.state.audit.close()
                if self.state.limits.usage is not None:
                    self.state.limits.usage.close()
                if self.state.ledger is not None:
                    self.state.ledger.close()  # a clean stop writes every queued usage record
                self.state.tracer.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def call(self, scope, receive, send) -> None:
        """A proxied call through its stages, in order: authenticate, read, resolve, admit, pick,
        reserve, forward; finish runs in a finally that a disconnect cannot skip. A stage refuses
        by raising a FabricError, answered here (with Connection: close while the body is unread)."""
        c = CallState(scope, receive, send, f"{self._id_prefix}{next(self._id_seq):016x}", time.perf_counter())
        try:
            await self._authenticate(c)
            await self._read(c)
            if await self._resolve(c):
                return
            await self._admit(c)
            await self._pick(c)
            await self._reserve(c)
            await self._forward(c)
        except ClientGone:
            c.status, c.outcome = 499, "client_closed"
            if c.budget is not None:  # charged what was relayed before the client left
                c.tokens = c.budget.used
        except UpstreamBroke:
            c.status, c.outcome = 502, "upstream_cut"
            raise  # aborts the connection, so the client sees a truncated response
        except TimeoutError:
            c.status, c.outcome = 504, "upstream_error"
            await self._send_fabric_error(c.send, UpstreamTimeout("the upstream deadline passed"),
                                          request_id=c.request_id)
        except FabricError as exc:
            c.status, c.outcome = exc.status, outcome_of(exc)
            await self._send_fabric_error(c.send, exc, close=not c.body_read, request_id=c.request_id)
        except Exception as exc:  # a bug: the call is audited 500 "error", and the traceback says where
            log.error("request %s failed inside the gateway", c.request_id, exc_info=exc)
            raise
        finally:
            if c.holder is not None:
                self._release_call(c.holder)
            await self._finish(c)

    async def _authenticate(self, c: CallState) -> None:
        """Who calls, before anything they send is read: one decoding of the raw path, the
        credential from the headers (a refusal is audited), the engine's control routes refused,
        and one of the credential's calls in progress held (429 past calls_per_key)."""
        c.route = self._route(c.scope)
        c.endpoint = c.route.endpoint
        c.headers = request_headers(c.scope["headers"])
        c.identity = await self._identify(c.headers, c.endpoint or None, c.request_id)
        self._keep_route(c.scope, c.route)  # cached only for authenticated callers
        check_served(c.route.path)  # the engine's control routes are never a caller's
        c.holder = self._hold_call(c.identity.subject)

    async def _read(self, c: CallState) -> None:
        """The body, whole, under the route's cap and before its deadline (408 when it trickles),
        then parsed the way the engine will read it, within the tenant's context cap."""
        st = self.state
        # Batch input files are uploaded whole; they get their own, larger cap.
        cap = st.settings.max_upload if c.route.is_upload else st.settings.max_body
        guard = c.scope.get("extensions", _NONE).get(GUARD)
        try:
            with self._deadlines.after(max(UPLOAD_DEADLINE_S, st.settings.body_secs) if c.route.is_upload
                                       else st.settings.body_secs, guard.task if guard is not None else None):
                c.body = await read_body(c.receive, c.headers, cap)
        except TimeoutError:
            raise BodyTimeout("the request body did not arrive in time; send it whole, without pauses") from None
        c.body_read = True
        c.tenant_context = await st.tenant_caps.max_context(c.identity.tenant) if st.tenant_caps else None
        c.info = await self._parse(c.body, c.headers.get("content-type", ""), c.route, c.tenant_context)

    async def _resolve(self, c: CallState) -> bool:
        """The endpoint and its view; True when the call was answered here (the root /v1/models).
        The root /v1 takes its endpoint from the body's model; the key's model scope is checked on
        the operation and ATTEMPT audited before the store is asked; the band and deadline come
        from the headers; a cold endpoint holds (or refuses) the call until a replica is ready.
        Only a resolved endpoint becomes a metric label."""
        st = self.state
        identity = c.identity
        if not c.endpoint:  # the root /v1: the endpoint comes from the body's model
            if c.scope["method"] == "GET" and c.route.path.rstrip("/") == "/v1/models":
                cat = await st.catalogue.get()
                await send_json(c.send, 200, models_page(cat, visible_models(cat, identity)))
                c.status, c.outcome = 200, "success"
                return True
            c.route, c.info = await self._by_model(identity, c.route, c.info, c.body)
            c.endpoint = c.route.endpoint
        check_model(identity, c.info.model, c.route.path, c.scope["method"])
        st.audit.record("ATTEMPT", request_id=c.request_id, key_id=identity.subject, tenant=identity.tenant,
                        endpoint=c.endpoint, model=c.info.model)
        c.deadline = request_timeout(c.headers, st.settings.total_deadline_secs)
        c.priority = call_band(c.headers.get("x-request-priority"),
                               identity.record.priority if identity.record else None)
        if st.cold_start is not None and not st.settings.dry_run:
            view = await st.cold_start.ready_view(c.endpoint)
            if view is None:  # refused, or held until a replica is ready (a client that leaves ends it)
                held = HeldStream(c.send, [(b"x-fabric-request-id", c.request_id.encode())]) if c.info.stream else None
                view = await run_unless_client_leaves(
                    st.cold_start.view(c.endpoint, identity.tenant or identity.subject, held, c.held_notes), c.receive,
                    c.scope.get("extensions", _NONE).get(GUARD))
                if held is not None and held.opened:
                    c.send = held  # the SSE head went out while held: the answer goes into that stream
        else:
            view = await st.upstreams.view(c.endpoint, need_upstream=not st.settings.dry_run)
        c.view = view
        c.label = c.endpoint  # resolved in the store: a bounded label from here on
        return False

    async def _admit(self, c: CallState) -> None:
        """Whether the call may go, and to which pool, before a replica is chosen: shed by queue
        depth for its band, placed by dispatch (spillover, bands, an external fallback, whose name
        limits, audit and spans then carry), the settings' and tenant's caps, the usage budget."""
        st = self.state
        dry = st.settings.dry_run
        identity, info = c.identity, c.info
        if not dry:
            check_shed(c.view, st.settings.shed_queue, c.priority, time.time())
        d = st.dispatcher
        if not dry and d is not None and needed(c.view, d.measure, d.room is not None):
            c.placement = await self._place(c.view, identity, c.priority, c.request_id, c.endpoint, info.model,
                                            (info.prompt_chars + 3) // 4 + (info.max_tokens or 0) * info.choices)
            c.view = c.placement.view
            if c.placement.external is not None:
                c.endpoint = c.placement.external.name  # limits, audit and spans name where the prompt went
        rec = identity.record
        c.facts = RequestFacts(
            endpoint=c.endpoint, model=info.model or "unknown", tenant=identity.tenant,
            project=c.headers.get("x-project-id"), user=c.headers.get("x-user-id"), gateway_id=st.gateway_id,
            caller=identity.subject,
            prompt_chars=info.prompt_chars, max_tokens=info.max_tokens, choices=info.choices,
            key_id=rec.id if rec else None, request_quota=rec.request_quota if rec else None,
            key_tokens_per_minute=rec.tokens_per_minute if rec else None,
            key_max_concurrent=rec.max_concurrent if rec else None,
        )
        check_caps(st.settings, c.facts, c.tenant_context)
        if st.ledger is not None:  # a refusing budget at 100% (gateway.usage_ledger)
            await st.ledger.check(identity.tenant, c.facts.key_id)

    async def _pick(self, c: CallState) -> None:
        """Where the call goes (gateway.pickers), explained and kept for its caller. A call to a
        replica carries its caller's prefix-cache salt (gateway.cache_salt) before the choice."""
        st = self.state
        external = c.placement.external if c.placement is not None else None
        if external is None:
            c.info = salted(c.info, c.body, c.route, st.auth.hmac_secret, c.identity.tenant, c.identity.subject)
        picker = self._pickers.for_call(c.view, c.info, external, st.settings.dry_run)
        if picker.kind == "adapter":
            c.used_adapter = c.info.model  # the usage row names it even when no replica can take it
        c.pick = await picker.pick(PickInput(c.view, c.info, c.route, c.headers, external))
        c.explained = {"request_id": c.request_id, "endpoint": c.endpoint, "model": c.info.model,
                       "band": c.priority, **c.pick.why, **(c.placement.notes if c.placement is not None else {}),
                       **c.held_notes}
        st.router.remember(c.request_id, c.identity.subject, c.explained)

    async def _reserve(self, c: CallState) -> None:
        """What the call takes, once it has a place to go: a model-scoped key's batch is checked
        against the picked targets (so this follows pick), then the limits' reservation (tokens,
        requests, concurrency; a shadowed limit is only counted and explained), then its use."""
        st = self.state
        rec = c.identity.record
        c.fwd_headers = upstream_headers(c.scope["headers"], c.request_id.encode())
        creates_batch = c.scope["method"] == "POST" and c.route.path.rstrip("/") == "/v1/batches"
        if rec is not None and rec.model and creates_batch and c.pick.external is not None:
            raise Forbidden("a model-scoped key cannot create batches at an external provider",
                            code="model_not_allowed")
        if rec is not None and rec.model and creates_batch and not st.settings.dry_run:
            await batch_scope.check_batch(st.client, c.pick.targets, c.fwd_headers, c.info.data, rec.model,
                                          st.settings.max_upload)
        plan = plan_admission(st.settings, c.facts)
        if plan:
            c.admission = await st.limits.admit(plan, c.facts.token_estimate,
                                                key_shadowed(rec.shadow_limits) if rec is not None else frozenset())
            self._count_shadowed(c.admission, 0)
            if c.admission.shadow:  # explained with the call (the same list, so a stream's additions too)
                c.explained["would_refuse"] = c.admission.would_refuse
        st.limits.count_use(c.facts)

    async def _forward(self, c: CallState) -> None:
        """The call at its pick, under the call's deadline: an external provider, an adapter's
        replica, or the picked replicas (usage always asked for, stream migration, a live token
        budget); the chosen replica's load counts the call while it runs. In dry run: a
        synthetic answer, every check and limit having been applied."""
        st = self.state
        if st.settings.dry_run:
            c.status, c.tokens = await dry_run.respond(c.send, c.info, c.endpoint)
            c.outcome = "success"
            return
        pick = c.pick
        in_flight = st.metrics.in_flight_for(c.endpoint)
        in_flight.inc()
        if pick.replica:
            st.router.started(pick.replica, pick.why.get("load_tokens", 0.0))
        try:
            guard = c.scope.get("extensions", _NONE).get(GUARD)
            with self._deadlines.after(c.deadline, guard.task if guard is not None else None):
                result = await run_unless_client_leaves(self._upstream_call(c), c.receive, guard)
                if c.budget is not None:
                    self._count_shadowed(c.admission, c.shadowed)  # passed mid-stream (gateway.live_budget)
        finally:
            in_flight.dec()
            if pick.replica:
                st.router.finished(pick.replica, pick.why.get("load_tokens", 0.0))
        c.status, c.tokens = result.status, result.tokens
        c.outcome = ("success" if result.ok else "upstream_cut" if result.cut else
                     "budget_cut" if result.cut_by else "upstream_error")
        if result.ttft_s is not None:
            st.metrics.ttft_for(c.endpoint).observe(result.ttft_s)

    def _upstream_call(self, c: CallState):
        """The coroutine that proxies the call to its pick (not yet awaited)."""
        st, pick, info, route = self.state, c.pick, c.info, c.route
        method = c.scope["method"]
        sent = info.body if info.body is not None else c.body
        marks = [(b"x-fabric-request-id", c.request_id.encode())]
        if c.admission is not None:
            marks += c.admission.headers  # x-ratelimit-* (gateway.ratelimit_headers)
        if pick.external is not None:
            return st.external.forward(c.send, pick.external, method, route.target, c.fwd_headers, sent,
                                       info.data, c.explained, marks)
        if pick.adapter:
            view, adapter, adapters = c.view, pick.adapter, self._pickers.adapter
            return st.adapters.forward(st.client, c.send, replica_urls(view, st.scheme), pick.replica, adapter,
                                       lambda: adapters.replica(view, adapter), method, route.target,
                                       c.fwd_headers, sent, info.stream, marks, c.explained)
        strip = None
        if (asked := inject(info, sent, route.path)) is not None:  # usage always known
            sent, strip = asked, UsageStripper()
        names = {url: rid for rid, url in replica_urls(c.view, st.scheme).items()}  # x-fabric-replica
        c.shadowed = len(c.admission.would_refuse) if c.admission is not None else 0
        if st.settings.live_budget:
            c.budget = live_budget(st.limits, c.admission, info.stream, route.path, c.facts.prompt_tokens)
        moving = self._migration(c.view, route.path, info, sent, c.fwd_headers, method, route.target, c.endpoint,
                                 c.explained)
        return forward(st.client, c.send, pick.targets, method, route.target, c.fwd_headers, sent, info.stream,
                       marks, strip, names, c.budget, moving)

    def _count_shadowed(self, admission: Admission, since: int) -> None:
        """Shadow mode: the limits this call passed without being refused (gateway.shadow)."""
        if self.state.metrics.shadow_refusals is not None:
            for what in admission.would_refuse[since:]:
                self.state.metrics.shadow_refusals.labels(what).inc()

    def _migration(self, view, path: str, info: BodyInfo, sent: bytes, headers: list, method: str,
                   target: bytes, endpoint: str, notes: dict) -> Migration | None:
        """A streamed chat or text completion's means to go on at another replica when its own
        is cut (gateway.stream_migration); None when migration is off or the call may not move."""
        st = self.state
        path = path.rstrip("/")
        if not info.stream or not st.settings.migrations_per_call or refusal(path, info.data) is not None:
            return None

        async def others(excluded: frozenset[str]) -> list[tuple[str, str]]:
            fresh = await st.upstreams.view(endpoint, need_upstream=False)
            replicas = [r for r in (fresh.replicas or view.replicas) if r.replica_id not in excluded]
            replicas.sort(key=lambda r: st.router.in_flight.get(r.replica_id, 0))
            return [(replica_target(r, st.scheme), r.replica_id) for r in replicas]

        return Migration(st.client, path, method, target, headers, sent, endpoint, others,
                         st.settings.migrations_per_call, self._moves, self._deaths, notes,
                         st.metrics.migration if st.metrics.migrations is not None else None)

    async def _place(self, view, identity: Identity, band: str, request_id: str, endpoint: str,
                     model: str | None, cost: int = 0) -> Placement:
        """gateway.dispatch's choice; a call refused by its band (full, displaced, timed out) is
        explained too."""
        try:
            return await self.state.dispatcher.place(view, identity, band, request_id, cost)
        except QueueRefused as exc:
            self.state.router.remember(request_id, identity.subject, {
                "request_id": request_id, "endpoint": endpoint, "model": model, **getattr(exc, "notes", {}),
                "band": band, "mode": "queue", "reason": exc.message, "displaced": exc.code == "displaced",
                "refused": exc.code})
            raise

    async def explain(self, scope, send) -> None:
        """GET /api/ai/explain/request/{id}: which scores chose the replica; only for the
        credential that made the call (any other: the same 404 as an unknown id)."""
        request_id = scope["path"][len(EXPLAIN):]
        try:
            identity = await self.state.auth.identify(request_headers(scope["headers"]), None)
            found = self.state.router.explanation(request_id, identity.subject)
            if found is None:
                raise NotFound("no explanation for this request id (kept 10 minutes by default, for its caller only)",
                               code="not_found")
            await send_json(send, 200, json.dumps(found).encode())
        except FabricError as exc:
            await self._send_fabric_error(send, exc)

    def _route(self, scope) -> Route:
        """parse_route, from the cache per (raw path, method) when an authenticated call already
        parsed it (the same few paths repeat on every call)."""
        raw, method = scope.get("raw_path") or scope["path"].encode(), scope["method"]
        route = self._routes.get((raw, method))
        if route is None:
            route = parse_route(raw, b"", method)  # a refusal raises
        qs = scope.get("query_string")
        return replace(route, target=route.target + b"?" + qs) if qs else route

    def _keep_route(self, scope, route: Route) -> None:
        """Cache an authenticated caller's route (never an anonymous one's: a flood of unique
        paths would fill it), without its query string, and only short paths."""
        raw, method = scope.get("raw_path") or scope["path"].encode(), scope["method"]
        if (raw, method) in self._routes or len(raw) > ROUTE_CACHE_PATH_MAX:
            return
        if len(self._routes) >= ROUTE_CACHE_MAX:
            self._routes.clear()
        qs = scope.get("query_string")
        self._routes[(raw, method)] = replace(route, target=route.target[:-len(qs) - 1]) if qs else route

    def _hold_call(self, subject: str) -> str:
        """One of the credential's calls in progress in this process; 429 past calls_per_key
        (FABRIC_GATEWAY_CALLS_PER_KEY: a caller's trickling bodies or idle calls cannot take every
        connection)."""
        held = self._calls.get(subject, 0)
        cap = self.state.settings.calls_per_key
        if held >= cap:
            raise LimitExceeded(f"this credential has {cap} calls in progress at this gateway; "
                                "wait for some to finish", retry_after=1.0, code="too_many_calls")
        self._calls[subject] = held + 1
        return subject

    def _release_call(self, subject: str) -> None:
        left = self._calls.get(subject, 0) - 1
        if left > 0:
            self._calls[subject] = left
        else:
            self._calls.pop(subject, None)

    async def _by_model(self, identity: Identity, route: Route, info: BodyInfo, body: bytes) -> tuple[Route, BodyInfo]:
        """The root /v1's endpoint, from the body's model (gateway.model_routing); the forwarded
        body names the model the replicas serve."""
        if info.model is None and (route.kind in ("read", "upload") or info.data is None):
            return replace(route, endpoint=endpoint_without_model(identity)), info
        target = resolve(await self.state.catalogue.get(), identity, info.model)
        if target.upstream_model != info.model:
            sent = info.body if info.body is not None else body
            info = replace(info, model=target.upstream_model, body=with_field(sent, info.data or {}, "model",
                                                                               target.upstream_model))
        return replace(route, endpoint=target.endpoint), info

    async def _identify(self, headers: dict[str, str], endpoint: str | None, request_id: str) -> Identity:
        """Authenticate from the headers; a refusal is audited (the credential's non-secret
        name only: a key's prefix, or "jwt"), rate-limited per process so a flood of bad keys
        cannot flood the chain."""
        try:
            try:
                return await self.state.auth.identify(headers, endpoint)
            except Forbidden as exc:
                # A valid credential for another endpoint, naming one that does not exist: a typo in
                # the path, so say not found rather than not allowed (only a valid credential gets
                # this far, so nobody can list endpoints without one).
                if exc.code != "endpoint_not_allowed" or endpoint is None or await self._endpoint_exists(endpoint):
                    raise
                raise NotFound(f"endpoint {endpoint!r} not found (check the name in the base URL: "
                               f"{PREFIX}ENDPOINT/v1)", code="endpoint_not_found") from None
        except FabricError as exc:
            self.state.audit.record_refusal(request_id=request_id, key_id=presented_id(headers), endpoint=endpoint,
                                            status=exc.status, reason=exc.code)
            raise

    async def _endpoint_exists(self, endpoint: str) -> bool:
        try:
            await self.state.upstreams.view(endpoint, need_upstream=False)
        except NotFound:
            return False
        return True

    async def _parse(self, body: bytes, content_type: str, route: Route, tenant_context: int | None = None) -> BodyInfo:
        policy = self.state.generation
        if tenant_context is not None:  # a default max_tokens that fits the tenant's context too
            policy = replace(policy, max_context=tighter(policy.max_context, tenant_context))
        if len(body) > OFF_LOOP_BYTES:
            return await asyncio.to_thread(parse_body, body, content_type, route, policy)
        return parse_body(body, content_type, route, policy)

    async def _send_fabric_error(self, send, exc: FabricError, close: bool = False,
                                 request_id: str | None = None) -> None:
        try:
            await send_error(send, exc, close, request_id)
        except (RuntimeError, OSError):
            log.debug("could not send an error body; the response had started")

    async def _finish(self, c: CallState) -> None:
        """Whatever stopped the call: its limits settled and its slot freed (shielded from a client
        that leaves), SUCCESS/FAILED audited, its outcome, tokens, usage row and span recorded."""
        st = self.state
        identity, admission, info, label, outcome, tokens = c.identity, c.admission, c.info, c.label, c.outcome, c.tokens
        elapsed = time.perf_counter() - c.t0
        counted = tokens if tokens is not None else admission.estimate if admission else 0
        if tokens is None and outcome == "success" and info.max_tokens is not None:
            counted = fallback_tokens(info)  # a generating call whose answer had no usage
            if st.metrics.usage_missing is not None:
                st.metrics.usage_missing.labels(label).inc()
        if admission is not None:
            # Shielded: a client that leaves must still free its slot and settle its tokens.
            await asyncio.shield(self._settle(admission, counted if outcome == "success" else (tokens or 0)))
        if identity is not None:
            kind = "SUCCESS" if outcome == "success" else "FAILED"
            shadow = {"would_refuse": ",".join(admission.would_refuse)} if admission and admission.would_refuse else {}
            st.audit.record(kind, request_id=c.request_id, key_id=identity.subject, tenant=identity.tenant,
                            endpoint=c.endpoint, model=info.model, status=c.status,
                            tokens=tokens or 0, latency_ms=round(elapsed * 1000, 3), reason=outcome, **shadow)
        st.metrics.outcome(label, outcome, elapsed)
        ledgered = st.ledger is not None and identity is not None and label != "unknown"
        # The caller names the model: a made-up name must not grow the metric labels or the hour's
        # usage document, so a label is a catalogue model's name and a usage row keeps the name only
        # when it is one or the call succeeded (the endpoint served it: an adapter or an alias).
        models = await st.upstreams.known_models() if label != "unknown" and (tokens or ledgered) else frozenset()
        known = info.model if info.model in models else "unknown"
        if ledgered:
            entered, produced, cached = split(counted if outcome == "success" else (tokens or 0),
                                              info.prompt_chars // 4)
            named = info.model or "unknown" if outcome == "success" else known
            st.ledger.record(Call(time.time(), Dims(identity.tenant, identity.record.id if identity.record else None,
                                                    c.endpoint, named, c.used_adapter, outcome),
                                  entered, produced, cached))
        if tokens:
            st.metrics.tokens_for(label, known).inc(tokens)
        st.tracer.span(endpoint=label, status=c.status, tokens=tokens or 0, seconds=elapsed)
        if outcome != "success":
            log.info("request %s endpoint=%s status=%s outcome=%s", c.request_id, label, c.status, outcome)

    async def _settle(self, admission: Admission, tokens: int) -> None:
        try:
            await self.state.limits.settle(admission, tokens)
        finally:
            await self.state.limits.release(admission)
