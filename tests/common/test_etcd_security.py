"""The secured etcd (TLS with client certificates, auth and roles on) admits only who it should,
and a refused client gets nothing and a StoreAccessDenied saying which setting to look at."""

from __future__ import annotations

import ast
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from common import keyspace
from common.errors import StoreAccessDenied, TransientError
from common.store.connect import open_store
from common.store.etcd_access import EtcdAccess
from common.store.etcd_auth import READWRITE, ROLES, Perm, init_auth, plan_role, prefix_end
from common.store.etcd_pki import issue_client, issue_server


@pytest.fixture
def marker(etcd_server):
    """A key fabricd wrote; every refused client below must neither see nor change it."""
    key = keyspace.auth(f"secret-{uuid.uuid4().hex[:8]}")
    fabricd = etcd_server.open("fabricd")
    fabricd.put(key, "crown-jewel")
    yield key
    assert fabricd.get(key).value == "crown-jewel"
    fabricd.delete(key)
    fabricd.close()


def refusal(etcd_server, access, call) -> str:
    store = open_store(etcd_server.url, access=access)
    try:
        with pytest.raises(StoreAccessDenied) as err:
            call(store)
    finally:
        store.close()
    assert err.value.status == 503 and err.value.code == "store_access_denied"
    assert "crown-jewel" not in err.value.message
    return err.value.message


def test_a_client_without_a_certificate_gets_nothing(etcd_server, marker):
    fabricd = etcd_server.access("fabricd")
    message = refusal(etcd_server, replace(fabricd, cert=None, key=None), lambda s: s.get(marker))
    assert "requires a client certificate" in message and "FABRIC_ETCD_CERT" in message


def test_a_certificate_of_another_ca_gets_nothing(etcd_server, marker, tmp_path):
    crt, key, _ = issue_client(tmp_path / "elsewhere", "fabricd", tmp_path / "certs")
    access = replace(etcd_server.access("fabricd"), cert=crt, key=key)
    message = refusal(etcd_server, access, lambda s: s.put(marker, "forged"))
    assert "refused this process's client certificate" in message and str(crt) in message


def test_a_server_our_ca_does_not_verify_gets_no_password(etcd_server, tmp_path):
    _, _, other_ca = issue_server(tmp_path / "elsewhere", "impostor", ["127.0.0.1"], tmp_path / "certs")
    access = replace(etcd_server.access("fabricd"), ca=other_ca)
    message = refusal(etcd_server, access, lambda s: s.get("/fabric/x"))
    assert "FABRIC_ETCD_CA does not verify" in message


def test_a_client_without_login_or_with_a_wrong_password_gets_nothing(etcd_server, marker):
    fabricd = etcd_server.access("fabricd")
    assert "no login" in refusal(etcd_server, replace(fabricd, user="", password=""), lambda s: s.get(marker))
    message = refusal(etcd_server, replace(fabricd, password="guess"), lambda s: s.get(marker))
    assert "refused the password of etcd user 'fabricd'" in message and "guess" not in message


def test_plain_http_to_the_tls_port_says_to_set_tls(etcd_server):
    store = open_store(etcd_server.url)
    with pytest.raises(TransientError, match="FABRIC_ETCD_CA"):
        store.get("/fabric/x")
    store.close()


@pytest.mark.parametrize("call", [
    lambda s, k: s.get(k),
    lambda s, k: s.put(k, "forged"),
    lambda s, k: s.delete(k),
    lambda s, k: s.list(keyspace.ROOT + "/"),
    lambda s, k: s.watch(keyspace.auth(), 0, 0.5),
    lambda s, k: s.put(keyspace.deployments("d"), "{}"),
    lambda s, k: s.put(keyspace.api_keys("k"), "{}"),
    lambda s, k: s.get(keyspace.users("admin")),
], ids=["read-secret", "write-secret", "delete-secret", "list-all", "watch-auth", "write-deployment", "write-key",
        "read-users"])
def test_the_gateway_role_may_not_touch_what_is_not_its(etcd_server, marker, call):
    message = refusal(etcd_server, etcd_server.access("gateway"), lambda s: call(s, marker))
    assert "etcd user 'gateway' may not" in message


def test_the_gateway_role_reads_and_writes_what_a_gateway_does(etcd_server):
    fabricd, gateway = etcd_server.open("fabricd"), etcd_server.open("gateway")
    name = uuid.uuid4().hex[:8]
    fabricd.put(keyspace.endpoints(name), "{}")
    assert gateway.get(keyspace.endpoints(name)).value == "{}"
    assert [kv.key for kv in gateway.list(keyspace.endpoints(name))] == [keyspace.endpoints(name)]
    lease = gateway.grant_lease(5)
    assert gateway.create(keyspace.counters(f"holders/{name}"), "1", lease=lease.id)
    assert gateway.refresh_lease(lease.id)
    gateway.revoke_lease(lease.id)
    assert gateway.get(keyspace.counters(f"holders/{name}")) is None
    for key in (keyspace.demand(name), keyspace.events(name), keyspace.audit(name)):
        rev = gateway.put(key, "1")
        assert gateway.get(key).mod_revision == rev
        assert gateway.delete(key, mod_revision=rev)
    assert gateway.revision() >= rev
    assert gateway.watch(keyspace.endpoints(name), 0, 0.5)[0].key == keyspace.endpoints(name)
    fabricd.delete(keyspace.endpoints(name))
    fabricd.close()
    gateway.close()


def test_a_gateways_view_cache_streams_only_what_its_role_may_watch(etcd_server):
    """The gateway's view cache follows spans the gateway role may watch, and it streams as that
    user (an observation reaches its copy from the stream); all of /fabric/, which holds the
    admin token and the users, it may not watch."""
    from gateway.upstreams import UpstreamCache
    from tests.common.test_store_mirror import _streamed_up_to

    fabricd, gateway = etcd_server.open("fabricd"), etcd_server.open("gateway")
    cache = UpstreamCache(gateway)
    try:
        with pytest.raises(StoreAccessDenied, match="may not watch /fabric/"):
            gateway.watch(keyspace.ROOT + "/", gateway.revision(), 0.2)
        cache.mirror.poll()
        key = keyspace.observations(f"r-{uuid.uuid4().hex[:8]}")
        _streamed_up_to(cache.mirror, fabricd.put(key, "{}"))
        streamed = cache.mirror.prefetched
        cache.mirror.poll()
        assert cache.mirror.prefetched == streamed + 1 and cache.mirror.get(key).value == "{}"
        fabricd.delete(key)
    finally:
        cache.close()
        fabricd.close()
        gateway.close()


def _keyspace_names(node: ast.AST) -> set[str]:
    return {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
            and n.value.id == "keyspace"}


def _record_uses(tree: ast.AST) -> set[tuple[str, str]]:
    """(records module, function) for every ``x.f`` where x is a module imported from common.records."""
    modules = {a.asname or a.name: a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
               and n.module == "common.records" for a in n.names}
    return {(modules[n.value.id], n.attr) for n in ast.walk(tree) if isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Name) and n.value.id in modules}


def _reached_through(root: Path, module: str, func: str) -> set[str]:
    """The keyspace names ``common.records.<module>.<func>`` reaches: its body and the module's own
    functions it calls; a verb bound from a Records object (no def of its own): the module's top level."""
    tree = ast.parse((root / "common" / "records" / f"{module}.py").read_text())
    defs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    if func not in defs:
        return set().union(*(_keyspace_names(n) for n in tree.body if not isinstance(n, (ast.FunctionDef, ast.ClassDef))))
    names, todo, seen = set(), [func], set()
    while todo:
        fn = defs[todo.pop()]
        seen.add(fn.name)
        names |= _keyspace_names(fn)
        todo += [n.func.id for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                 and n.func.id in defs and n.func.id not in seen]
    return names


def test_every_prefix_the_gateway_code_names_is_in_its_role():
    """A new gateway feature that reads or writes a new part of the store must widen the role: the
    prefixes its code names, and those the common.records functions it calls reach."""
    root = Path(__file__).resolve().parents[2]
    names: set[str] = set()
    for path in [*(root / "gateway").rglob("*.py"), root / "common" / "usage_ledger.py", root / "common" / "budgets.py",
                 root / "common" / "audit_chain.py"]:
        tree = ast.parse(path.read_text())
        names |= _keyspace_names(tree)
        for module, func in _record_uses(tree):
            names |= _reached_through(root, module, func)
    assert names >= {"endpoints", "counters", "audit", "routing_plans", "api_keys", "api_key_prefixes"}
    granted = ROLES["gateway"]
    for name in sorted(names - {"ROOT"}):
        prefix = getattr(keyspace, name)()
        assert any(p.key <= prefix < p.range_end for p in granted if p.range_end), f"gateway role lacks {prefix}"


def test_an_expired_token_logs_in_again(etcd_server):
    store = etcd_server.open("fabricd")
    store.put("/fabric/t/token", "1")
    store._token = "expired.1"  # what etcd answers after --auth-token-ttl of silence
    for client in store._clients:
        client.session.headers["Authorization"] = "expired.1"
    assert store.get("/fabric/t/token").value == "1"
    assert store._token != "expired.1"
    store.close()


def test_role_plan_grants_what_is_missing_and_revokes_what_is_extra():
    wanted = ROLES["gateway"]
    extra = Perm(keyspace.auth(), prefix_end(keyspace.auth()), READWRITE)
    some = sorted(wanted)[:3]
    grant, revoke = plan_role(frozenset({*some, extra}), wanted)
    assert revoke == [extra] and set(grant) == wanted - set(some)
    assert plan_role(wanted, wanted) == ([], [])
    assert not any(p.key.startswith(keyspace.auth()) or p.key.startswith(keyspace.users()) for p in wanted)


def test_init_auth_converges_and_a_second_run_changes_nothing(etcd_server):
    certs = etcd_server.certs
    tls = EtcdAccess(ca=certs / "ca.crt", cert=certs / "etcd-root.crt", key=certs / "etcd-root.key")
    endpoints = [(etcd_server.host, etcd_server.port)]
    passwords = certs / "passwords"
    assert init_auth(endpoints, tls, passwords) == []
    root = etcd_server.open("root")
    root.auth_call("/auth/role/grant", {"name": "gateway", "perm": {
        "permType": READWRITE, "key": _b64(keyspace.auth()), "range_end": _b64(prefix_end(keyspace.auth()))}})
    root.close()
    assert init_auth(endpoints, tls, passwords) == ["role gateway: revoked READWRITE /fabric/auth/"]
    assert init_auth(endpoints, tls, passwords) == []
    assert (passwords / "gateway.password").stat().st_mode & 0o777 == 0o600


def _b64(text: str) -> str:
    import base64

    return base64.b64encode(text.encode()).decode()
