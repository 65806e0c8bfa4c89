"""Model aliases travel in backups (controlplane.backup.document): built, validated, and checked
against the endpoint they name."""

from __future__ import annotations

import json

import pytest

from common import keyspace
from common.errors import InvalidInput
from controlplane.backup.document import build, plan_restore

ALIAS = {"name": "team/chat", "endpoint": "chat", "model_name": "m", "created_at": 1.0}


def test_an_alias_is_backed_up_and_restored_only_with_its_endpoint():
    doc = build({"model_aliases": [(keyspace.model_aliases("team/chat"), json.dumps(ALIAS))]}, now=0)
    assert doc["sections"]["model_aliases"] == {"team/chat": ALIAS}
    plan = plan_restore(doc, {"endpoints": {"chat": {"name": "chat"}}})
    assert plan.records[("model_aliases", "team/chat")]["endpoint"] == "chat"
    with pytest.raises(InvalidInput, match="chat"):
        plan_restore(doc, {})
    bad = build({"model_aliases": [(keyspace.model_aliases("x"), json.dumps({**ALIAS, "name": "x", "bogus": 1}))]})
    with pytest.raises(InvalidInput, match="bogus"):
        plan_restore(bad, {"endpoints": {"chat": {}}})


def test_identity_mappings_and_tenant_limits_are_backed_up_and_validated():
    mapping = {"name": "ml-team", "claim": "groups", "value": "/ml-team", "endpoints": ["chat"], "issuer": None,
               "tenant": None, "created_at": 1.0}
    limits = {"tenant": "acme", "max_context_tokens": 4096, "updated_at": 1.0}
    doc = build({"identity_mappings": [(keyspace.identity_mappings("ml-team"), json.dumps(mapping))],
                 "tenant_limits": [(keyspace.tenant_limits("acme"), json.dumps(limits))]}, now=0)
    plan = plan_restore(doc, {})
    assert plan.records[("identity_mappings", "ml-team")]["value"] == "/ml-team"
    assert plan.records[("tenant_limits", "acme")]["max_context_tokens"] == 4096
    bad = build({"tenant_limits": [(keyspace.tenant_limits("acme"), json.dumps({**limits, "max_context_tokens": 0}))]})
    with pytest.raises(InvalidInput, match="max_context_tokens"):
        plan_restore(bad, {})
