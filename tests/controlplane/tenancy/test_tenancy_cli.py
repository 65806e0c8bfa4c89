"""fabricctl ai user|policy|key-policy|admit and login as a local user or through OIDC, run as
the real console script against the tenancy tests' fabricd."""

from __future__ import annotations

import json
import os
import time

import pytest

from tests.controlplane.tenancy.conftest import OIDC_CLIENT, OIDC_ISSUER, seed
from tests.controlplane.test_fabricctl_cli import ctl

PASSWORD = "cli-user-password-42"


@pytest.fixture(scope="module")
def env(tenancy_fabricd, tmp_path_factory) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("FABRIC_")}
    home = tmp_path_factory.mktemp("tenancy-cli")
    base.update(FABRIC_URL=tenancy_fabricd.url, HOME=str(home), XDG_CONFIG_HOME=str(home / "xdg"))
    ctl(base, "ai", "login", "--password-file", str(tenancy_fabricd.state_dir / "admin-password"))
    return base


def test_users_log_in_with_their_role_and_tenant(env, tmp_path):
    added = ctl({**env, "FABRIC_NEW_PASSWORD": PASSWORD}, "ai", "user", "add", "cli-ops", "--role", "operator",
                "--tenant", "cli", "--json")
    assert json.loads(added.stdout)["tenant"] == "cli" and PASSWORD not in added.stdout
    assert "cli-ops" in ctl(env, "ai", "user", "list").stdout
    user_env = {**env, "XDG_CONFIG_HOME": str(tmp_path / "xdg"), "FABRIC_PASSWORD": PASSWORD}
    assert "logged in as cli-ops" in ctl(user_env, "ai", "login", "--username", "cli-ops").stdout
    refused = ctl(user_env, "ai", "user", "list", ok=False)
    assert refused.returncode != 0 and "admin" in refused.stderr
    assert "deleted" in ctl(env, "ai", "user", "delete", "cli-ops").stdout


def test_oidc_login_from_a_token_file(env, idp, tmp_path):
    token = idp.sign({"iss": OIDC_ISSUER, "aud": OIDC_CLIENT, "sub": "carol", "exp": int(time.time()) + 300,
                      "fabric_role": "viewer", "fabric_tenant": "cli"})
    (tmp_path / "id-token").write_text(token)
    oidc_env = {**env, "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    out = ctl(oidc_env, "ai", "login", "--id-token-file", str(tmp_path / "id-token"))
    assert "logged in as viewer (OIDC)" in out.stdout and token not in out.stdout


def test_policy_key_policy_and_admit(env, tenancy_fabricd, tokens, tmp_path):
    with tenancy_fabricd.client(tokens["admin"]) as admin:
        names = seed(admin, "clip", "clip")
    ctl(env, "ai", "policy", "set", "clip", "--model", "other-model", "--hours", "22-6")
    assert "clip" in ctl(env, "ai", "policy", "list").stdout
    assert ctl(env, "ai", "policy", "set", "clip", "--hours", "late", ok=False).returncode == 2
    doc = tmp_path / "dep.yaml"
    doc.write_text(f"name: clip-2\nmodel: {names['model']}\nprofile: {names['profile']}\ntenant: clip\n")
    refused = ctl(env, "ai", "admit", "-f", str(doc), ok=False)
    assert refused.returncode == 1 and "allowed_models" in refused.stdout
    ctl(env, "ai", "policy", "set", "clip")
    assert ctl(env, "ai", "admit", "-f", str(doc)).stdout.strip() == "allowed"
    ctl(env, "ai", "key-policy", "set", names["endpoint"], "--max-ttl", "3600", "--require-scope", "model")
    shown = json.loads(ctl(env, "ai", "key-policy", "show", names["endpoint"], "--json").stdout)
    assert shown["max_ttl_secs"] == 3600 and shown["required_scopes"] == ["model"]
