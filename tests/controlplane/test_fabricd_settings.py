"""controlplane.settings.load: every FABRIC_* value fabricd reads is checked at start, and a bad
one is named with why (fabricd serve then exits 2, see test_api_quotas_scaling)."""

from __future__ import annotations

import pytest

from controlplane.settings import FabricdSettings, SettingsError, load
from controlplane.state import AppState


@pytest.mark.parametrize("name, value, why", [
    ("FABRIC_ADDRESS_POOL", "fd00::/64", "FABRIC_ADDRESS_POOL='fd00::/64'"),
    ("FABRIC_SERVICE_CIDR", "10.0.0.0/33", "FABRIC_SERVICE_CIDR='10.0.0.0/33'"),
    ("FABRIC_RECONCILE_SECS", "soon", "is not a number"),
    ("FABRIC_ROUTING_SECS", "0", "expected from 0.05 to 3600"),
    ("FABRIC_AUTOSCALE_SECS", "nan", "expected from 0.05"),
    ("FABRIC_LEADER_TTL_SECS", "1.5", "is not an integer"),
    ("FABRIC_DRAIN_GRACE_SECS", "-1", "expected from 0"),
    ("FABRIC_SCRAPE_TIMEOUT_SECS", "0", "expected from 0.1 to 60"),
    ("FABRIC_HEALTH_TIMEOUT_SECS", "forever", "is not a number"),
    ("FABRIC_MAX_GPU_TEMP_C", "hot", "is not a number"),
    ("FABRIC_REJECT_ECC", "maybe", "expected 1/0"),
    ("FABRIC_AVOID_BUGGY_IPS", "2", "expected 1/0"),
    ("FABRIC_DENY_RUNTIMES", "vllm,tritn", "unknown runtime tritn"),
    ("FABRIC_ALLOW_RUNTIMES", "docker", "unknown runtime docker"),
    ("FABRIC_TOKEN_TTL", "5", "expected from 60"),
    ("FABRIC_EVENTS_KEPT", "-3", "expected from 10"),
    ("FABRIC_EVENTS_MAX_AGE_SECS", "x", "is not a number"),
    ("FABRIC_KEY_HMAC_SECRET_FILE", "/nonexistent/secret", "does not exist"),
    ("FABRIC_MODEL_JOBS_SECS", "0", "out of range"),
    ("FABRIC_DRY_RUN", "maybe", "expected 1 (dry run) or 0"),
    ("FABRIC_MODEL_CACHE_BYTES", "10GB", "is not an integer"),
    ("FABRIC_MAX_BATCHES", "0", "out of range"),
    ("FABRIC_PCI_MIG", "true", "is not 1 or 0"),
    ("FABRIC_MODEL_DIR", "models", "is not an absolute path"),
    ("FABRIC_LOGIN_OIDC_ISSUER", "https://idp.test", "missing FABRIC_LOGIN_OIDC_JWKS_URL, FABRIC_LOGIN_OIDC_CLIENT_ID"),
    ("FABRIC_ADMIT_TOKEN", "short-secret", "shorter than 16 characters"),
    ("FABRIC_CONSOLE_GATEWAY_URL", "gateway:8443", "is not an http:// or https:// URL"),
    ("FABRIC_CONSOLE_GATEWAY_CA", "/nonexistent/ca.crt", "is not a readable file"),
])
def test_bad_values_are_named(name, value, why):
    with pytest.raises(SettingsError) as err:
        load({name: value})
    assert name in str(err.value) and why in str(err.value)


def test_defaults_and_good_values():
    s = load({})
    # an AppState built without settings holds exactly what fabricd reads from an empty environment
    assert s == FabricdSettings() == AppState(store=None, state_dir=None).settings  # type: ignore[arg-type]
    assert (s.controllers.reconcile_s, s.controllers.routing_s, s.controllers.autoscale_s) == (15.0, 10.0, 15.0)
    s = load({"FABRIC_AUTOSCALE_SECS": "2.5", "FABRIC_ADDRESS_POOL": "10.96.0.7", "FABRIC_REJECT_ECC": "true",
              "FABRIC_DENY_RUNTIMES": "triton", "FABRIC_EVENTS_KEPT": "50"}, insecure=True)
    assert s.controllers.autoscale_s == 2.5 and s.scheduler.reject_ecc is True
    assert s.deny_runtimes == ("triton",) and s.events_kept == 50 and s.insecure is True
    assert [e.text for e in s.pool.entries] == ["10.96.0.7"]
    assert (s.controllers.scrape_timeout_s, s.controllers.health_timeout_s) == (2.0, 2.0)
    s = load({"FABRIC_SCRAPE_TIMEOUT_SECS": "10", "FABRIC_HEALTH_TIMEOUT_SECS": "7.5"})
    assert (s.controllers.scrape_timeout_s, s.controllers.health_timeout_s) == (10.0, 7.5)


def test_the_real_engine_lab_gives_busy_cpu_engines_longer_deadlines(tmp_path):
    """A real vLLM on a loaded 2-core machine can take seconds to answer /metrics or /health; the
    simulator's lab keeps fabricd's defaults."""
    from lab.cluster import LabConfig, service_env

    (tmp_path / "key-hmac-secret").write_text("s" * 32)  # up writes it before fabricd starts
    real, sim = service_env(LabConfig(tmp_path, engine="vllm"), "fabricd"), service_env(LabConfig(tmp_path), "fabricd")
    assert load(real).controllers.scrape_timeout_s == 10.0 and load(real).controllers.health_timeout_s == 10.0
    assert load(real).controllers.drain_grace_s == 120.0
    assert load(sim).controllers.scrape_timeout_s == 2.0 and load(sim).controllers.drain_grace_s == 30.0


def test_every_bad_value_is_reported_at_once():
    with pytest.raises(SettingsError) as err:
        load({"FABRIC_RECONCILE_SECS": "x", "FABRIC_ADDRESS_POOL": "nope"})
    assert "FABRIC_RECONCILE_SECS" in str(err.value) and "FABRIC_ADDRESS_POOL" in str(err.value)


def test_secrets_and_the_inference_audience_are_refused_without_echo():
    with pytest.raises(SettingsError) as err:
        load({"FABRIC_ADMIT_TOKEN": "tiny-secret", "FABRIC_LOGIN_OIDC_ISSUER": "https://idp.test",
              "FABRIC_LOGIN_OIDC_JWKS_URL": "https://idp.test/jwks", "FABRIC_LOGIN_OIDC_CLIENT_ID": "fabric-inference"})
    assert "tiny-secret" not in str(err.value) and "may not be 'fabric-inference'" in str(err.value)


def test_the_console_knows_the_gateway_address_and_its_ca(tmp_path):
    from controlplane.console.views import gateway_base

    ca = tmp_path / "ca.crt"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    got = load({"FABRIC_CONSOLE_GATEWAY_URL": "https://gw.example:8443/", "FABRIC_CONSOLE_GATEWAY_CA": str(ca)})
    assert got.gateway_url == "https://gw.example:8443" and got.gateway_ca == str(ca)
    assert gateway_base("chat", got.gateway_url) == "https://gw.example:8443/api/ai/openai/chat/v1"
    assert gateway_base("chat") == "/api/ai/openai/chat/v1"  # fabricd was not told the address
