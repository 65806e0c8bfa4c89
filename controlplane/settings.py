"""Every FABRIC_* setting fabricd reads, parsed and validated once at start: ``load(env)``.

``fabricd serve`` calls ``load`` before it binds anything; a bad value stops it with a message
naming each bad variable and why (exit status 2), instead of a live API over dead controllers.
The result, one frozen ``FabricdSettings``, is the process's one handle: AppState.settings, read
by the API, ops and the controllers; no other module reads os.environ
(tests/common/test_settings_only_read_env.py). ``FabricdSettings()`` is every default (what an
AppState built without settings holds).

  FABRIC_RECONCILE_SECS (15)  FABRIC_ROUTING_SECS (10)  FABRIC_AUTOSCALE_SECS (15)   periods, 0.05-3600
  FABRIC_MODEL_JOBS_SECS (2)                             model jobs period, 0.05-3600
  FABRIC_LEADER_TTL_SECS (15)                            leader lease TTL, whole seconds 2-300
  FABRIC_DRAIN_GRACE_SECS (30)                           drain grace, 0-86400
  FABRIC_START_TIMEOUT_SECS (900)                        the most a replica's start budget may be (its runtime's,
                                                         common.runtimes; Starting, not failing), 10-86400
  FABRIC_STALL_SECS (60)                                 running requests, no new tokens this long: weight 0, 5-86400
  FABRIC_SCRAPE_TIMEOUT_SECS (2)                         one engine /metrics scrape's deadline (a miss excludes it), 0.1-60
  FABRIC_HEALTH_TIMEOUT_SECS (2)                         one health probe's deadline (3 misses replace a replica), 0.1-60
  FABRIC_CRASHLOOP_AFTER (5), FABRIC_CRASHLOOP_BACKOFF_SECS (10), FABRIC_CRASHLOOP_BACKOFF_MAX_SECS (300),
  FABRIC_CRASHLOOP_RESET_SECS (600)                      crash loop: park after N failures, backoff, reset
  FABRIC_DRY_RUN (0)                                     1: synthetic replicas, no agent (controlplane.dryrun)
  FABRIC_ADDRESS_POOL / FABRIC_SERVICE_CIDR              VIP pool (controlplane.placement.vip_pool syntax, IPv4)
  FABRIC_AVOID_BUGGY_IPS (1)                             boolean
  FABRIC_MAX_GPU_TEMP_C, FABRIC_REJECT_ECC               scheduler filters
  FABRIC_DENY_RUNTIMES, FABRIC_ALLOW_RUNTIMES            comma-separated known runtime names
  FABRIC_TOKEN_TTL (43200)                               admin token lifetime, seconds 60-2592000
  FABRIC_EVENTS_KEPT (1000), FABRIC_EVENTS_MAX_AGE_SECS (604800)   event log bounds
  FABRIC_MAX_BODY_BYTES (1048576)                        request body limit (413 above), 1024-1073741824
  FABRIC_KEY_HMAC_SECRET_FILE                            when set, must be a readable non-empty file
  FABRIC_MODEL_CACHE_BYTES, FABRIC_MAX_BATCHES           whole numbers (>= 0, 1-10000000)
  FABRIC_USAGE_RETENTION_DAYS (90)                       usage ledger kept this long, 1-3660 (common.usage_ledger)
  FABRIC_NOTIFY_SECS (5)                                 notification delivery period, 0.05-3600 (controlplane.tenancy.notifier)
  FABRIC_NOTIFY_ALERTS (0)                               1: fabricd raises the paging alerts to webhooks itself (no Prometheus)
  FABRIC_MAX_BLOB_BYTES (1 TiB)                          largest model blob a peer site may send
  FABRIC_PCI_MIG, FABRIC_PCI_MIG_RECORD_ONLY             1 or 0;  FABRIC_MODEL_DIR  an absolute path
  FABRIC_LOGIN_OIDC_ISSUER/_JWKS_URL/_CLIENT_ID          all three or none (controlplane.tenancy.oidc_login)
  FABRIC_ADMIT_TOKEN                                     when set, at least 16 characters (POST /api/ai/admit/{token})
  FABRIC_REPLICATE_TOKEN                                 a peer site's token for model blob copies (api/model_blobs.py)
  FABRIC_METRICS_TOKEN                                   when set, /metrics needs Authorization: Bearer TOKEN (also the gateway's)
  FABRIC_KEY_HMAC_SECRET(_FILE)                          API key digests; unset: key routes answer 503 no_hmac_secret
  FABRIC_ETCD_CA/_CERT/_KEY, FABRIC_ETCD_USER/_PASSWORD_FILE   how to reach etcd (common.store.etcd_access)
Booleans accept 1/0, true/false, yes/no, on/off (any case); empty means the default.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from common.apikeys import NO_HMAC_SECRET, HmacSecretError, load_hmac_secret
from common.envvars import EnvError
from common.errors import FabricError
from common.schemas import RUNTIMES
from common.store import etcd_access
from common.store.etcd_access import EtcdAccess
from controlplane.mig.catalog import MigSettings
from controlplane.placement import vip_pool
from controlplane.placement.scheduler import SchedulerSettings
from controlplane.tenancy import oidc_login

TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
MIN_ADMIT_TOKEN = 16
DEFAULT_TOKEN_TTL_S = 12 * 3600
DEFAULT_EVENTS_KEPT = 1000
DEFAULT_MAX_BODY_BYTES = 1024 * 1024  # fabricd refuses larger request bodies with 413


class SettingsError(ValueError):
    """One or more FABRIC_* values are unusable; the message names each variable."""


@dataclass
class _Reader:
    env: Mapping[str, str]
    errors: list[str] = field(default_factory=list)

    def raw(self, name: str) -> str:
        return self.env.get(name, "").strip()

    def bad(self, name: str, why: str) -> None:
        self.errors.append(f"{name}={self.raw(name)!r} {why}")

    def number(self, name: str, default: float, lo: float, hi: float, *, integer: bool = False):
        text = self.raw(name)
        if not text:
            return default
        try:
            value = int(text) if integer else float(text)
        except ValueError:
            self.bad(name, f"is not {'an integer' if integer else 'a number'} (expected from {lo:g} to {hi:g})")
            return default
        if not lo <= value <= hi:  # also refuses NaN
            self.bad(name, f"is out of range: expected from {lo:g} to {hi:g}")
            return default
        return value

    def optional_number(self, name: str, lo: float, hi: float) -> float | None:
        return self.number(name, None, lo, hi) if self.raw(name) else None

    def boolean(self, name: str, default: bool) -> bool:
        text = self.raw(name).lower()
        if not text:
            return default
        if text in TRUE or text in FALSE:
            return text in TRUE
        self.bad(name, "is not a yes/no value: expected 1/0, true/false, yes/no or on/off")
        return default

    def runtimes(self, name: str) -> tuple[str, ...]:
        names = tuple(r.strip() for r in self.raw(name).split(",") if r.strip())
        unknown = [r for r in names if r not in RUNTIMES]
        if unknown:
            self.bad(name, f"names unknown runtime {', '.join(unknown)}; known: {', '.join(RUNTIMES)}")
        return names

    def check(self, names: str, fn: Callable[[], object]):
        try:
            return fn()
        except (FabricError, ValueError) as exc:
            self.errors.append(f"{names} is refused: {getattr(exc, 'message', exc)}")
            return None


@dataclass(frozen=True)
class ControllerSettings:
    reconcile_s: float = 15.0
    routing_s: float = 10.0
    autoscale_s: float = 15.0
    leader_ttl_s: int = 15
    drain_grace_s: float = 30.0
    models_s: float = 2.0  # model jobs: poll the agents for progress
    start_timeout_s: float = 900.0  # the cap on a replica's start budget (controlplane.reconcile.plan)
    stall_s: float = 60.0  # running > 0 and no new tokens this long: weight 0 (controlplane.routing.stall)
    scrape_timeout_s: float = 2.0  # one /metrics scrape's deadline; a miss excludes the replica that tick
    health_timeout_s: float = 2.0  # one health probe's deadline (controlplane.reconcile.plan.FAILURES_TO_REPLACE)
    crashloop_after: int = 5  # controlplane.reconcile.crashloop
    crashloop_backoff_s: float = 10.0
    crashloop_backoff_max_s: float = 300.0
    crashloop_reset_s: float = 600.0
    dry_run: bool = False  # FABRIC_DRY_RUN=1: synthetic replicas, no agent (controlplane.dryrun)
    # every field read and range-checked from FABRIC_* by load below


def dry_run_from_env(env) -> bool:
    raw = env.get("FABRIC_DRY_RUN", "").strip().lower()
    if raw in ("", "0", "false", "no"):
        return False
    if raw in ("1", "true", "yes"):
        return True
    raise ValueError(f"FABRIC_DRY_RUN={env.get('FABRIC_DRY_RUN')!r}: expected 1 (dry run) or 0")


def _default_pool() -> vip_pool.AddressPool:
    return vip_pool.parse_pool(vip_pool.DEFAULT_SERVICE_CIDR)


@dataclass(frozen=True)
class FabricdSettings:
    controllers: ControllerSettings = field(default_factory=ControllerSettings)
    scheduler: SchedulerSettings = field(default_factory=SchedulerSettings)
    pool: vip_pool.AddressPool = field(default_factory=_default_pool)
    deny_runtimes: tuple[str, ...] = ()
    allow_runtimes: tuple[str, ...] = ()
    # the API's own
    token_ttl_s: int = DEFAULT_TOKEN_TTL_S  # FABRIC_TOKEN_TTL: lifetime of an admin bearer token
    events_kept: int = DEFAULT_EVENTS_KEPT  # FABRIC_EVENTS_KEPT: older events are trimmed from the store
    events_max_age_s: float = 7 * 86400.0  # FABRIC_EVENTS_MAX_AGE_SECS: and events older than this
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES  # FABRIC_MAX_BODY_BYTES: larger request bodies get 413
    insecure: bool = False  # serving plain HTTP on loopback (fabricd serve --insecure)
    run_controllers: bool = True  # False: an API-only process (fabricd serve --no-controllers)
    # read by API routes per request, validated here once
    model_dir: str = "/srv/models"  # FABRIC_MODEL_DIR
    model_cache_bytes: int | None = None  # FABRIC_MODEL_CACHE_BYTES; None: unset
    max_batches: int = 10_000  # FABRIC_MAX_BATCHES
    usage_retention_s: float = 90 * 86400.0  # FABRIC_USAGE_RETENTION_DAYS
    notify_s: float = 5.0  # FABRIC_NOTIFY_SECS
    notify_alerts: bool = False  # FABRIC_NOTIFY_ALERTS
    max_blob_bytes: int = 1 << 40  # FABRIC_MAX_BLOB_BYTES
    mig: MigSettings = field(default_factory=MigSettings)  # FABRIC_PCI_MIG, FABRIC_PCI_MIG_RECORD_ONLY
    login_oidc: oidc_login.OidcLoginSettings | None = None  # None: OIDC login off
    admit_token: str = field(default="", repr=False)  # FABRIC_ADMIT_TOKEN; "": the webhook is off
    replicate_token: str = field(default="", repr=False)  # FABRIC_REPLICATE_TOKEN; "": blob copies refused
    metrics_token: str = field(default="", repr=False)  # FABRIC_METRICS_TOKEN; "": /metrics is public
    key_hmac_secret: bytes | None = field(default=None, repr=False)  # None: see key_hmac_error
    key_hmac_error: str = NO_HMAC_SECRET  # why API keys are unavailable (no secret configured)
    prometheus_url: str = ""  # FABRIC_PROMETHEUS_URL; "": the console charts read fabricd's own bounded history
    gateway_url: str = ""  # FABRIC_CONSOLE_GATEWAY_URL; "": the console playground is off
    gateway_ca: str = ""  # FABRIC_CONSOLE_GATEWAY_CA: the CA file the playground verifies the gateway with; "": system CAs
    store_access: EtcdAccess | None = None  # FABRIC_ETCD_*: TLS files and login for an etcd store; None: plain


def load(env: Mapping[str, str] | None = None, *, insecure: bool = False,
         run_controllers: bool = True) -> FabricdSettings:
    """Parse and validate every setting; SettingsError naming each bad variable. ``insecure`` and
    ``run_controllers`` are fabricd serve's flags (--insecure, --no-controllers)."""
    env = os.environ if env is None else env
    r = _Reader(env)
    controllers = ControllerSettings(
        reconcile_s=r.number("FABRIC_RECONCILE_SECS", 15.0, 0.05, 3600),
        routing_s=r.number("FABRIC_ROUTING_SECS", 10.0, 0.05, 3600),
        autoscale_s=r.number("FABRIC_AUTOSCALE_SECS", 15.0, 0.05, 3600),
        leader_ttl_s=r.number("FABRIC_LEADER_TTL_SECS", 15, 2, 300, integer=True),
        drain_grace_s=r.number("FABRIC_DRAIN_GRACE_SECS", 30.0, 0, 86400),
        models_s=r.number("FABRIC_MODEL_JOBS_SECS", 2.0, 0.05, 3600),
        start_timeout_s=r.number("FABRIC_START_TIMEOUT_SECS", 900.0, 10, 86400),
        stall_s=r.number("FABRIC_STALL_SECS", 60.0, 5, 86400),
        scrape_timeout_s=r.number("FABRIC_SCRAPE_TIMEOUT_SECS", 2.0, 0.1, 60),
        health_timeout_s=r.number("FABRIC_HEALTH_TIMEOUT_SECS", 2.0, 0.1, 60),
        crashloop_after=r.number("FABRIC_CRASHLOOP_AFTER", 5, 1, 1000, integer=True),
        crashloop_backoff_s=r.number("FABRIC_CRASHLOOP_BACKOFF_SECS", 10.0, 0, 86400),
        crashloop_backoff_max_s=r.number("FABRIC_CRASHLOOP_BACKOFF_MAX_SECS", 300.0, 0, 86400),
        crashloop_reset_s=r.number("FABRIC_CRASHLOOP_RESET_SECS", 600.0, 1, 30 * 86400),
        dry_run=bool(r.check(f"FABRIC_DRY_RUN={r.raw('FABRIC_DRY_RUN')!r}", lambda: dry_run_from_env(env))),
    )
    temp = r.optional_number("FABRIC_MAX_GPU_TEMP_C", 1, 150)
    scheduler = SchedulerSettings(max_gpu_temp_c=temp, reject_ecc=r.boolean("FABRIC_REJECT_ECC", False))
    avoid = r.boolean("FABRIC_AVOID_BUGGY_IPS", True)
    pool_var = "FABRIC_ADDRESS_POOL" if r.raw("FABRIC_ADDRESS_POOL") else "FABRIC_SERVICE_CIDR"
    pool_text = r.raw(pool_var) or vip_pool.DEFAULT_SERVICE_CIDR
    pool = r.check(f"{pool_var}={pool_text!r}", lambda: vip_pool.parse_pool(pool_text, avoid_buggy=avoid))
    deny, allow = r.runtimes("FABRIC_DENY_RUNTIMES"), r.runtimes("FABRIC_ALLOW_RUNTIMES")
    api = dict(
        token_ttl_s=r.number("FABRIC_TOKEN_TTL", DEFAULT_TOKEN_TTL_S, 60, 30 * 86400, integer=True),
        events_kept=r.number("FABRIC_EVENTS_KEPT", DEFAULT_EVENTS_KEPT, 10, 1_000_000, integer=True),
        events_max_age_s=r.number("FABRIC_EVENTS_MAX_AGE_SECS", 7 * 86400.0, 60, 365 * 86400),
        max_body_bytes=r.number("FABRIC_MAX_BODY_BYTES", DEFAULT_MAX_BODY_BYTES, 1024, 1024**3, integer=True),
        insecure=insecure, run_controllers=run_controllers,
    )
    # Used by API routes per request (model cache eviction, batches, finops, blobs, MIG).
    cache_bytes = r.number("FABRIC_MODEL_CACHE_BYTES", None, 0, 2**62, integer=True)
    max_batches = r.number("FABRIC_MAX_BATCHES", 10_000, 1, 10_000_000, integer=True)
    usage_retention_s = r.number("FABRIC_USAGE_RETENTION_DAYS", 90, 1, 3660) * 86400.0
    notify_s = r.number("FABRIC_NOTIFY_SECS", 5.0, 0.05, 3600)
    notify_alerts = r.boolean("FABRIC_NOTIFY_ALERTS", False)
    max_blob_bytes = r.number("FABRIC_MAX_BLOB_BYTES", 1 << 40, 1, 2**62, integer=True)
    for flag in ("FABRIC_PCI_MIG", "FABRIC_PCI_MIG_RECORD_ONLY"):
        if r.raw(flag) not in ("", "0", "1"):
            r.bad(flag, "is not 1 or 0")
    mig = MigSettings(pci_mig=r.raw("FABRIC_PCI_MIG") == "1", record_only=r.raw("FABRIC_PCI_MIG_RECORD_ONLY") == "1")
    model_dir = r.raw("FABRIC_MODEL_DIR") or "/srv/models"
    if not model_dir.startswith("/"):
        r.bad("FABRIC_MODEL_DIR", "is not an absolute path")
    login_oidc = None
    try:
        login_oidc = oidc_login.settings_from_env(env)
    except ValueError as exc:
        r.errors.append(str(exc))
    if r.raw("FABRIC_ADMIT_TOKEN") and len(r.raw("FABRIC_ADMIT_TOKEN")) < MIN_ADMIT_TOKEN:
        # Never r.bad: its message quotes the value, and this one is a secret.
        r.errors.append(f"FABRIC_ADMIT_TOKEN is shorter than {MIN_ADMIT_TOKEN} characters; use a long random string")
    hmac_secret, hmac_error = None, ""
    try:
        hmac_secret = load_hmac_secret(env)
    except HmacSecretError as exc:
        if r.raw("FABRIC_KEY_HMAC_SECRET_FILE"):  # named but unusable: refused at start
            r.errors.append(str(exc))
        hmac_error = str(exc)  # none configured: API keys unavailable (503), the rest serves
    console_urls = {}
    for var, key in (("FABRIC_PROMETHEUS_URL", "prometheus_url"), ("FABRIC_CONSOLE_GATEWAY_URL", "gateway_url")):
        console_urls[key] = r.raw(var).rstrip("/")
        if console_urls[key] and not console_urls[key].startswith(("http://", "https://")):
            r.bad(var, "is not an http:// or https:// URL")
    console_urls["gateway_ca"] = r.raw("FABRIC_CONSOLE_GATEWAY_CA")
    if console_urls["gateway_ca"] and not Path(console_urls["gateway_ca"]).is_file():
        r.bad("FABRIC_CONSOLE_GATEWAY_CA", "is not a readable file")
    store_access = None
    try:
        store_access = etcd_access.from_env(env)
    except EnvError as exc:
        r.errors.append(str(exc))
    if r.errors:
        raise SettingsError("; ".join(r.errors))
    return FabricdSettings(controllers, scheduler, pool, deny, allow, **api, model_dir=model_dir,
                           model_cache_bytes=cache_bytes, max_batches=max_batches, usage_retention_s=usage_retention_s,
                           notify_s=notify_s, notify_alerts=notify_alerts,
                           max_blob_bytes=max_blob_bytes, mig=mig, login_oidc=login_oidc,
                           admit_token=r.raw("FABRIC_ADMIT_TOKEN"), replicate_token=r.raw("FABRIC_REPLICATE_TOKEN"),
                           metrics_token=r.raw("FABRIC_METRICS_TOKEN").strip(),
                           key_hmac_secret=hmac_secret, key_hmac_error=hmac_error, store_access=store_access,
                           **console_urls)
