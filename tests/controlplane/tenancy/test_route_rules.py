"""THE route table (controlplane.tenancy.route_rules) is complete and enforced: every route of
fabricd's /openapi.json has a rule, and calling it as each kind of caller (no token, viewer,
operator, tenant-bound viewer and operator, admin) over real HTTP answers what the rule says.
A route added without a rule fails here; so does a route whose router forgot the enforcer."""

from __future__ import annotations

import pytest

from common.store.connect import open_store
from controlplane.auth import ensure_token_secret, issue_token
from controlplane.tenancy import route_rules
from controlplane.tenancy.principal import Principal
from controlplane.tenancy.route_rules import CLUSTER, NODE_AUTH, OWNED, PUBLIC_AUTH, Rule, decide
from tests.controlplane.tenancy.conftest import CALLERS, Caller, seed

INT_PARAMS = {"revision", "rollout_id"}
ABSENT = "zz-absent"
LOGOUT = ("POST", "/api/auth/logout")


def _fresh_token(server, caller: Caller) -> str:
    """Another token for the same caller (logging out revokes the one it presents)."""
    store = open_store(None, server.state_dir)
    try:
        secret = ensure_token_secret(store)
    finally:
        store.close()
    return issue_token(secret, caller.name, 600, role=caller.role, tenant=caller.tenant)[0]


@pytest.fixture(scope="module")
def walk(tenancy_fabricd, tokens):
    """tenant b's objects (by kind), and the schema's routes."""
    with tenancy_fabricd.client(tokens["admin"]) as admin:
        owned = seed(admin, "b", "walk")
        key = admin.post("/api/ai/keys", json={"name": "walk-key", "endpoint": owned["endpoint"], "tenant": "b"})
        assert key.status_code == 201, key.text
        owned["key"] = key.json()["id"]
        schema = admin.get("/openapi.json").json()
    routes = [(method.upper(), path) for path, item in schema["paths"].items() for method in item
              if method in ("get", "post", "put", "patch", "delete")]
    return owned, routes


def test_every_route_in_the_schema_has_a_rule_and_every_rule_a_route(walk):
    _, routes = walk
    missing = [f"{m} {p}" for m, p in routes if route_rules.rule_for(m, p) is None]
    assert not missing, f"routes without a rule in controlplane/tenancy/route_rules.py: {missing}"
    stale = [f"{m} {p}" for m, p in route_rules.RULES if (m, p) not in set(routes)]
    assert not stale, f"rules for routes that do not exist: {stale}"


def _url(path: str, rule: Rule, caller: Caller, owned: dict[str, str]) -> str:
    for part in path.split("{")[1:]:
        param = part.split("}")[0]
        name = param.split(":")[0]
        if rule.tenant == OWNED and name == rule.param and caller.bound:
            value = owned[rule.kind]  # another tenant's real object: must read as absent
        else:
            value = "1" if name in INT_PARAMS else ABSENT
        path = path.replace("{" + param + "}", value)
    return path


def _expected(rule: Rule, caller: Caller) -> tuple[int | None, str | None]:
    """(status, error code) the rule demands; (None, None): allowed (anything but 401/403)."""
    if rule.auth == PUBLIC_AUTH:
        return None, None
    if caller.role is None:
        return 401, "no_token"
    if caller.role not in rule.roles:
        return 403, ("read_only" if caller.role == "viewer" else "forbidden")
    if caller.bound and rule.tenant == CLUSTER:
        return 403, "cluster_scoped"
    if caller.bound and rule.tenant == OWNED:
        return 404, "not_found"
    return None, None


@pytest.mark.parametrize("caller", CALLERS, ids=lambda c: c.name)
def test_each_route_answers_each_caller_as_its_rule_says(walk, tenancy_fabricd, tokens, caller):
    owned, routes = walk
    wrong = []
    with tenancy_fabricd.client(tokens[caller.name]) as client:
        for method, path in routes:
            rule = route_rules.rule_for(method, path)
            if rule is None or rule.auth == NODE_AUTH:  # the test above names a missing rule
                continue
            url = _url(path, rule, caller, owned)
            headers = {}
            if (method, path) == LOGOUT and caller.role is not None:  # revokes the token: use a copy
                headers["authorization"] = f"Bearer {_fresh_token(tenancy_fabricd, caller)}"
            resp = client.request(method, url, json={} if method in ("POST", "PUT", "PATCH") else None,
                                  headers=headers)
            status, code = _expected(rule, caller)
            got_code = resp.json().get("error", {}).get("code") if resp.headers.get(
                "content-type", "").startswith("application/json") and isinstance(resp.json(), dict) else None
            if status is None and resp.status_code in (401, 403):
                wrong.append(f"{method} {url}: allowed by its rule, got {resp.status_code} {got_code}")
            elif status is not None and (resp.status_code, got_code) != (status, code):
                wrong.append(f"{method} {url}: rule says {status} {code}, got {resp.status_code} {got_code}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("rule,principal,code", [
    (route_rules.read(), Principal("v", "viewer"), None),
    (route_rules.write(), Principal("v", "viewer"), "read_only"),
    (route_rules.admin(), Principal("v", "viewer"), "read_only"),
    (route_rules.admin(), Principal("o", "operator"), "forbidden"),
    (route_rules.write(), Principal("o", "operator"), None),
    (route_rules.read(), Principal("o", "operator", "a"), "cluster_scoped"),
    (route_rules.read(route_rules.FILTERED), Principal("o", "operator", "a"), None),
    (route_rules.write(route_rules.owned("model", "name")), Principal("o", "operator", "a"), None),
    (route_rules.admin(), Principal("root", "admin", "a"), None),  # an admin is never bound
])
def test_decide_table(rule, principal, code):
    refusal = decide(rule, principal)
    assert (refusal.code if refusal else None) == code
