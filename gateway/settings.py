"""Every FABRIC_* variable the gateway reads, parsed and validated once at start.

A bad value stops the process with a message naming the variable; nothing reads os.environ
after start. Limits that are unset or 0 are off (None here).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from common import envvars
from common.apikeys import NO_HMAC_SECRET, HmacSecretError, load_hmac_secret
from common.store import etcd_access
from common.store.etcd_access import EtcdAccess
from gateway.heap_profile import frames_from_env
from gateway.hold import HoldPolicy
from gateway.shadow import shadowed_limits

SCOPES = ("GLOBAL", "TENANT", "PROJECT", "MODEL", "USER", "GATEWAY")


class SettingsError(ValueError):
    pass


@dataclass(frozen=True)
class OidcProvider:
    issuer: str
    jwks_url: str
    # The claims this issuer may assert (OIDC_CLAIMS): ``tenant`` (the token's tenant) and
    # ``endpoints`` (FABRIC_OIDC_ENDPOINTS_CLAIM); none unless configured (gateway.oidc).
    claims: frozenset[str] = frozenset()


@dataclass(frozen=True)
class BackendTls:
    enabled: bool = False
    client_cert: str | None = None
    client_key: str | None = None
    ca: str | None = None


@dataclass(frozen=True)
class GatewaySettings:
    rpm: dict[str, int] = field(default_factory=dict)  # scope -> requests per minute
    tpm: dict[str, int] = field(default_factory=dict)  # scope -> tokens per minute
    streams: dict[str, int] = field(default_factory=dict)  # scope -> in-flight calls
    daily_tokens: int | None = None
    max_prompt_tokens: int | None = None
    max_generated_tokens: int | None = None
    max_context: int = 32768
    default_max_tokens: int = 4096  # written into a generating body that names no cap
    max_body: int = 1024 * 1024
    max_upload: int = 100 * 1024 * 1024  # POST /v1/files (batch input), FABRIC_GATEWAY_MAX_UPLOAD
    idle_secs: float = 60.0
    total_deadline_secs: float = 120.0
    body_secs: float = 30.0  # FABRIC_GATEWAY_BODY_SECS: after authentication, a body arrives whole within this
    calls_per_key: int = 256  # FABRIC_GATEWAY_CALLS_PER_KEY: calls in progress per credential per process
    shed_queue: float | None = None
    saturation_queue: float | None = None  # FABRIC_SATURATION_QUEUE: healthy queue depth (gateway.capacity)
    saturation_kv: float | None = None  # FABRIC_SATURATION_KV: KV cache use ceiling, 0-1
    band_queue: int = 64  # FABRIC_BAND_QUEUE: waiting calls per band and endpoint (gateway.bands)
    band_total: int = 128  # FABRIC_BAND_TOTAL: waiting calls over all bands of an endpoint
    band_ttl_secs: float = 30.0  # FABRIC_BAND_TTL_SECS: longest wait
    provider_key_dir: str = "/etc/fabric/provider-keys"  # FABRIC_PROVIDER_KEY_DIR (gateway.external)
    accept_any_jwt_audience: bool = False
    oidc_providers: tuple[OidcProvider, ...] = ()
    backend_tls: BackendTls = field(default_factory=BackendTls)
    otel_endpoint: str | None = None
    dry_run: bool = False
    cache_ttl_secs: float = 1.0
    hold: HoldPolicy = field(default_factory=HoldPolicy)  # FABRIC_GATEWAY_HOLD_*: calls held for a replica (cold start)
    # FABRIC_GATEWAY_MIGRATIONS_PER_CALL: how often a cut stream may go on at another replica (0: never;
    # gateway.stream_migration); FABRIC_GATEWAY_MIGRATIONS_PER_ENDPOINT: moves per endpoint and minute
    migrations_per_call: int = 2
    migrations_per_endpoint: int = 600
    oidc_endpoints_claim: str = "fabric_endpoints"
    oidc_tenant_endpoints: bool = True  # FABRIC_OIDC_TENANT_ENDPOINTS=0: a token's tenant owns nothing by itself
    slot_lease_secs: int = 10  # in-flight slots of a dead gateway come back within this
    upstream_client: str = "http1"  # or "aiohttp" (needs aiohttp importable; for measurement)
    explain_secs: float = 600.0  # FABRIC_GATEWAY_EXPLAIN_SECS: how long a call's routing explanation is kept
    # FABRIC_GATEWAY_KV_TOKENIZERS: routing_l7 prefix asks the agents' KV index with tokenizers fetched from
    # the agents' model caches (gateway/kv_source.py, docs/kv-events.md); a directory of deployments'
    # tokenizers overrides those; "off" keeps prefix routing approximate
    kv_tokenizers: str = ""
    # FABRIC_GATEWAY_KV_CLIENT_CERT/_KEY/_CA: the client certificate the agents' KV index admits (CN in their
    # --kv-index-client-cn); unset, the backend TLS settings are used for the agents too
    kv_agent_tls: BackendTls = field(default_factory=BackendTls)
    http_server: str = "gateway"  # gateway.http_server, or "uvicorn" (its own protocol: measurement, a way out)
    reclaim_secs: float | None = 60.0  # FABRIC_GATEWAY_RECLAIM_SECS: full gc + malloc_trim every N s; 0: off
    # PROMETHEUS_MULTIPROC_DIR set (by `serve --workers N`, for prometheus_client): every worker's
    # metrics are files in it, and a scrape sums them
    metrics_multiprocess: bool = False
    metrics_token: str | None = None  # FABRIC_METRICS_TOKEN: /metrics then needs this bearer token
    shadow_limits: frozenset[str] = frozenset()  # FABRIC_<LIMIT>_SHADOW=1: counted, never refusing (gateway.shadow)
    usage_ledger: bool = True  # FABRIC_GATEWAY_USAGE_LEDGER=0: no usage records and no budgets (gateway.usage_ledger)
    live_budget: bool = True  # FABRIC_GATEWAY_LIVE_BUDGET=0: streams not counted as they run (gateway.live_budget)
    # FABRIC_GATEWAY_CLOCK_FILE: the limit windows read the time from this file instead of the system clock
    # (gateway.limits.window_clock; the tests' one fake clock)
    clock_file: str | None = None
    store_access: EtcdAccess | None = None  # FABRIC_ETCD_*: TLS files and login for an etcd store (common.store.etcd_access)
    # FABRIC_KEY_HMAC_SECRET(_FILE): API key digests; None: unset (fabric-gateway serve refuses to start,
    # saying key_hmac_error)
    key_hmac_secret: bytes | None = field(default=None, repr=False)
    key_hmac_error: str = NO_HMAC_SECRET
    heap_frames: int | None = None  # FABRIC_GATEWAY_TRACEMALLOC (gateway.heap_profile): None off, 0 native


def _number(env: dict[str, str], name: str, default=None, cast=int):
    """A non-negative int (or float, with cast=float) from env; unset or 0 means the default."""
    try:
        v = envvars.number(env, name, None, cast)
    except envvars.EnvError as exc:
        raise SettingsError(str(exc)) from None
    return v or default


def _fraction(env: dict[str, str], name: str) -> float | None:
    value = _number(env, name, None, float)
    if value is not None and value > 1:
        raise SettingsError(f"{name} must be a fraction between 0 and 1, got {value}")
    return value


def _flag(env: dict[str, str], name: str) -> bool:
    raw = env.get(name, "").strip().lower()
    if raw in ("", "0", "false", "no"):
        return False
    if raw in ("1", "true", "yes"):
        return True
    raise SettingsError(f"{name}={raw!r}: expected 1 or 0")


OIDC_CLAIMS = ("tenant", "endpoints")


def _oidc_claims(names, where: str) -> frozenset[str]:
    if isinstance(names, str):
        names = names.replace(",", " ").split()
    if not isinstance(names, list) or any(n not in OIDC_CLAIMS for n in names):
        raise SettingsError(f"{where}: the claims an issuer may assert are a list of {', '.join(OIDC_CLAIMS)}")
    return frozenset(names)


def _oidc(env: dict[str, str]) -> tuple[OidcProvider, ...]:
    """FABRIC_OIDC_PROVIDERS is a JSON list of {issuer, jwks_url, claims?}; FABRIC_OIDC_ISSUER plus
    FABRIC_OIDC_JWKS_URL (and FABRIC_OIDC_CLAIMS) is the one-provider shorthand. ``claims``: which
    of OIDC_CLAIMS the issuer may assert (absent: none)."""
    providers: list[OidcProvider] = []
    raw = env.get("FABRIC_OIDC_PROVIDERS", "").strip()
    if raw:
        try:
            items = json.loads(raw)
            providers += [OidcProvider(str(i["issuer"]), str(i["jwks_url"]),
                                       _oidc_claims(i.get("claims", []), "FABRIC_OIDC_PROVIDERS")) for i in items]
        except (ValueError, KeyError, TypeError, AttributeError):
            raise SettingsError("FABRIC_OIDC_PROVIDERS must be a JSON list of {issuer, jwks_url, claims?} "
                                f"(claims: a list of {', '.join(OIDC_CLAIMS)})") from None
    issuer, jwks = env.get("FABRIC_OIDC_ISSUER", "").strip(), env.get("FABRIC_OIDC_JWKS_URL", "").strip()
    if bool(issuer) != bool(jwks):
        raise SettingsError("FABRIC_OIDC_ISSUER and FABRIC_OIDC_JWKS_URL must be set together")
    if issuer:
        providers.append(OidcProvider(issuer, jwks, _oidc_claims(env.get("FABRIC_OIDC_CLAIMS", ""),
                                                                 "FABRIC_OIDC_CLAIMS")))
    return tuple(providers)


def _backend_tls(env: dict[str, str]) -> BackendTls:
    names = ("FABRIC_BACKEND_CLIENT_CERT", "FABRIC_BACKEND_CLIENT_KEY", "FABRIC_BACKEND_CA")
    values = [env.get(n, "").strip() or None for n in names]
    # A client certificate or key makes it mTLS, which needs all three; FABRIC_BACKEND_CA alone
    # is server-only TLS verified against that CA (e.g. the cluster CA) instead of the trust store.
    if (values[0] or values[1]) and not all(values):
        missing = [n for n, v in zip(names, values) if not v]
        raise SettingsError(f"backend mTLS needs all of {', '.join(names)}; missing {', '.join(missing)}")
    for n, v in zip(names, values):
        if v and not os.path.isfile(v):
            raise SettingsError(f"{n} {v} does not exist")
    enabled = _flag(env, "FABRIC_BACKEND_TLS")
    if any(values) and not enabled:
        raise SettingsError("FABRIC_BACKEND_CA or client certificates are set but FABRIC_BACKEND_TLS is not 1")
    return BackendTls(enabled, *values)


def _kv_agent_tls(env: dict[str, str]) -> BackendTls:
    names = ("FABRIC_GATEWAY_KV_CLIENT_CERT", "FABRIC_GATEWAY_KV_CLIENT_KEY", "FABRIC_GATEWAY_KV_CA")
    values = [env.get(n, "").strip() or None for n in names]
    if any(values) and not all(values):  # the agents demand a client certificate from the cluster CA
        missing = [n for n, v in zip(names, values) if not v]
        raise SettingsError(f"the agents' KV index over mTLS needs all of {', '.join(names)}; "
                            f"missing {', '.join(missing)}")
    for n, v in zip(names, values):
        if v and not os.path.isfile(v):
            raise SettingsError(f"{n} {v} does not exist")
    return BackendTls(all(values), *values)


def _upstream_client(env: dict[str, str]) -> str:
    value = env.get("FABRIC_GATEWAY_UPSTREAM_CLIENT", "").strip() or "http1"
    if value not in ("http1", "aiohttp"):
        raise SettingsError("FABRIC_GATEWAY_UPSTREAM_CLIENT must be http1 or aiohttp")
    if value == "aiohttp":
        try:
            import aiohttp  # noqa: F401
        except ImportError:
            raise SettingsError("FABRIC_GATEWAY_UPSTREAM_CLIENT=aiohttp but aiohttp is not importable") from None
    return value


def _lease_secs(env: dict[str, str]) -> int:
    secs = _number(env, "FABRIC_GATEWAY_SLOT_LEASE_SECS", 10)
    if not 2 <= secs <= 300:
        raise SettingsError("FABRIC_GATEWAY_SLOT_LEASE_SECS must be from 2 to 300 seconds")
    return secs


def load(env: dict[str, str] | None = None) -> GatewaySettings:
    env = dict(os.environ if env is None else env)
    rpm = {s: v for s in SCOPES if (v := _number(env, f"FABRIC_{s}_RPM"))}
    tpm = {s: v for s in SCOPES if (v := _number(env, f"FABRIC_{s}_TPM"))}
    streams = {s: v for s in SCOPES if (v := _number(env, f"FABRIC_{s}_STREAMS"))}
    return GatewaySettings(
        rpm=rpm,
        tpm=tpm,
        streams=streams,
        daily_tokens=_number(env, "FABRIC_DAILY_TOKENS"),
        max_prompt_tokens=_number(env, "FABRIC_MAX_PROMPT_TOKENS"),
        max_generated_tokens=_number(env, "FABRIC_MAX_GENERATED_TOKENS"),
        max_context=_number(env, "FABRIC_MAX_CONTEXT", 32768),
        default_max_tokens=_number(env, "FABRIC_DEFAULT_MAX_TOKENS", 4096),
        max_body=_number(env, "FABRIC_GATEWAY_MAX_BODY", 1024 * 1024),
        max_upload=_number(env, "FABRIC_GATEWAY_MAX_UPLOAD", 100 * 1024 * 1024),
        idle_secs=_number(env, "FABRIC_GATEWAY_IDLE_SECS", 60.0, float),
        body_secs=_bounded(env, "FABRIC_GATEWAY_BODY_SECS", 30.0, 1, 600),
        calls_per_key=int(_bounded(env, "FABRIC_GATEWAY_CALLS_PER_KEY", 256, 1, 100_000)),
        shed_queue=_number(env, "FABRIC_SHED_QUEUE", None, float),
        saturation_queue=_number(env, "FABRIC_SATURATION_QUEUE", None, float),
        saturation_kv=_fraction(env, "FABRIC_SATURATION_KV"),
        band_queue=_number(env, "FABRIC_BAND_QUEUE", 64),
        band_total=_number(env, "FABRIC_BAND_TOTAL", 128),
        band_ttl_secs=_number(env, "FABRIC_BAND_TTL_SECS", 30.0, float),
        provider_key_dir=env.get("FABRIC_PROVIDER_KEY_DIR", "").strip() or "/etc/fabric/provider-keys",
        accept_any_jwt_audience=_flag(env, "FABRIC_GATEWAY_ACCEPT_JWT"),
        oidc_providers=_oidc(env),
        backend_tls=_backend_tls(env),
        otel_endpoint=env.get("FABRIC_OTEL_ENDPOINT", "").strip() or None,
        dry_run=_flag(env, "FABRIC_DRY_RUN"),
        cache_ttl_secs=_number(env, "FABRIC_GATEWAY_CACHE_SECS", 1.0, float),
        hold=_hold(env),
        migrations_per_call=_count(env, "FABRIC_GATEWAY_MIGRATIONS_PER_CALL", 2, 0, 16),
        migrations_per_endpoint=_count(env, "FABRIC_GATEWAY_MIGRATIONS_PER_ENDPOINT", 600, 1, 1_000_000),
        oidc_endpoints_claim=env.get("FABRIC_OIDC_ENDPOINTS_CLAIM", "").strip() or "fabric_endpoints",
        oidc_tenant_endpoints=env.get("FABRIC_OIDC_TENANT_ENDPOINTS", "").strip() != "0",
        slot_lease_secs=_lease_secs(env),
        upstream_client=_upstream_client(env),
        explain_secs=_explain_secs(env),
        kv_tokenizers=env.get("FABRIC_GATEWAY_KV_TOKENIZERS", "").strip(),
        kv_agent_tls=_kv_agent_tls(env),
        shadow_limits=shadowed_limits(env),
        live_budget=env.get("FABRIC_GATEWAY_LIVE_BUDGET", "").strip() != "0",
        usage_ledger=env.get("FABRIC_GATEWAY_USAGE_LEDGER", "").strip() != "0",
        http_server=_http_server(env),
        reclaim_secs=_reclaim_secs(env),
        metrics_multiprocess=bool(env.get("PROMETHEUS_MULTIPROC_DIR")),
        metrics_token=env.get("FABRIC_METRICS_TOKEN", "").strip() or None,
        clock_file=_clock_file(env),
        store_access=_store_access(env),
        **_hmac_secret(env),
        heap_frames=_heap_frames(env),
    )


def _hmac_secret(env: dict[str, str]) -> dict:
    """A named FABRIC_KEY_HMAC_SECRET_FILE that is unusable is refused; none at all is said at serve."""
    try:
        return {"key_hmac_secret": load_hmac_secret(env), "key_hmac_error": ""}
    except HmacSecretError as exc:
        if env.get("FABRIC_KEY_HMAC_SECRET_FILE", "").strip():
            raise SettingsError(str(exc)) from None
        return {"key_hmac_secret": None, "key_hmac_error": str(exc)}


def _heap_frames(env: dict[str, str]) -> int | None:
    try:
        return frames_from_env(env)
    except ValueError as exc:
        raise SettingsError(str(exc)) from None


def _store_access(env: dict[str, str]) -> EtcdAccess | None:
    try:
        return etcd_access.from_env(env)
    except envvars.EnvError as exc:
        raise SettingsError(str(exc)) from None


def _clock_file(env: dict[str, str]) -> str | None:
    path = env.get("FABRIC_GATEWAY_CLOCK_FILE", "").strip() or None
    if path is not None:
        try:
            float(Path(path).read_text())
        except (OSError, ValueError):
            raise SettingsError(f"FABRIC_GATEWAY_CLOCK_FILE {path} is not a readable file holding a Unix time") \
                from None
    return path


def _bounded(env: dict[str, str], name: str, default: float, low: float, high: float) -> float:
    value = _number(env, name, default, float)
    if not low <= value <= high:  # also refuses NaN
        raise SettingsError(f"{name}={value:g}: expected {low:g} to {high:g}")
    return value


def _count(env: dict[str, str], name: str, default: int, low: int, high: int) -> int:
    """A whole number from low to high; unset means the default (0 is a value here)."""
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r}: expected a whole number from {low} to {high}") from None
    if not low <= value <= high:
        raise SettingsError(f"{name}={value}: expected {low} to {high}")
    return value


def _http_server(env: dict[str, str]) -> str:
    value = env.get("FABRIC_GATEWAY_HTTP_SERVER", "").strip() or "gateway"
    if value not in ("gateway", "uvicorn"):
        raise SettingsError("FABRIC_GATEWAY_HTTP_SERVER must be gateway or uvicorn")
    return value


def _hold(env: dict[str, str]) -> HoldPolicy:
    """FABRIC_GATEWAY_HOLD_SECS (unset: each endpoint's runtime start budget, gateway.cold_start.hold_bound;
    0: answer model_loading at once), the waiting rooms' bounds and the keep-alive period of a held stream."""
    raw = env.get("FABRIC_GATEWAY_HOLD_SECS", "").strip()
    try:
        secs = float(raw) if raw else None
    except ValueError:
        raise SettingsError(f"FABRIC_GATEWAY_HOLD_SECS={raw!r}: expected seconds from 0 to 3600") from None
    if secs is not None and not 0 <= secs <= 3600:  # also refuses NaN
        raise SettingsError(f"FABRIC_GATEWAY_HOLD_SECS={secs:g}: expected 0 to 3600 seconds")
    return HoldPolicy(secs=secs,
                      per_endpoint=_count(env, "FABRIC_GATEWAY_HOLD_PER_ENDPOINT", HoldPolicy.per_endpoint, 1, 100_000),
                      per_tenant=_count(env, "FABRIC_GATEWAY_HOLD_PER_TENANT", HoldPolicy.per_tenant, 1, 100_000),
                      keepalive_s=_bounded(env, "FABRIC_GATEWAY_HOLD_KEEPALIVE_SECS", HoldPolicy.keepalive_s, 0.1, 120))


def _explain_secs(env: dict[str, str]) -> float:
    value = _number(env, "FABRIC_GATEWAY_EXPLAIN_SECS", 600.0, float)
    if not 1 <= value <= 3600:  # also refuses NaN
        raise SettingsError(f"FABRIC_GATEWAY_EXPLAIN_SECS={value:g}: expected 1 to 3600 seconds")
    return value


def _reclaim_secs(env: dict[str, str]) -> float | None:
    if env.get("FABRIC_GATEWAY_RECLAIM_SECS", "").strip() == "0":
        return None  # off
    value = _number(env, "FABRIC_GATEWAY_RECLAIM_SECS", 60.0, float)
    if not 1 <= value <= 3600:  # also refuses NaN
        raise SettingsError(f"FABRIC_GATEWAY_RECLAIM_SECS={value:g}: expected 1 to 3600 seconds, or 0 (off)")
    return value
