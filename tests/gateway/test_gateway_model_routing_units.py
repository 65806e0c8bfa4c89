"""Planner tests for gateway.model_routing: resolution order, what each caller may see."""

from __future__ import annotations

import pytest

from common.errors import InvalidInput, NotFound
from common.schemas import ApiKeyRecord
from gateway.key_auth import Identity
from gateway.model_routing import Catalogue, endpoint_without_model, resolve, visible_models

CAT = Catalogue({"ep-a": "m-a", "ep-b": "m-b", "ep-a2": "m-a"},
                {"stable": ("ep-a", None), "renamed": ("ep-b", "m-b-v2"), "b-only": ("ep-b", None)})


def key(endpoint: str, model: str | None = None) -> Identity:
    rec = ApiKeyRecord(id="k", name="k", prefix="p", hash="h", endpoint=endpoint, model=model)
    return Identity("key", "k", None, rec)


def test_alias_first_then_served_model_only_on_endpoints_the_caller_may_call():
    assert resolve(CAT, key("ep-a"), "stable") == resolve(CAT, key("ep-a"), "m-a")
    assert resolve(CAT, key("ep-a"), "stable").upstream_model == "m-a"
    assert resolve(CAT, key("ep-b"), "renamed").upstream_model == "m-b-v2"
    assert resolve(CAT, key("ep-a2"), "m-a").endpoint == "ep-a2"  # the same model on two endpoints
    oidc = Identity("oidc", "s", None, endpoints=("ep-b",))
    assert resolve(CAT, oidc, "m-b").endpoint == "ep-b"
    for ident, model in ((key("ep-a"), "m-b"), (key("ep-a"), "renamed"), (key("ep-a"), "nope"),
                         (Identity("oidc", "s", None, endpoints=None), "m-a")):
        with pytest.raises(NotFound) as exc:
            resolve(CAT, ident, model)
        assert exc.value.code == "model_not_found" and "ep-" not in exc.value.message
    with pytest.raises(InvalidInput):
        resolve(CAT, key("ep-a"), None)


def test_visible_models_are_exactly_what_resolves_for_the_caller():
    assert visible_models(CAT, key("ep-a")) == ["m-a", "stable"]
    assert visible_models(CAT, key("ep-b")) == ["b-only", "m-b", "renamed"]
    assert visible_models(CAT, key("ep-b", model="m-b")) == ["b-only", "m-b"]
    assert visible_models(CAT, Identity("oidc", "s", None, endpoints=("*",))) == [
        "b-only", "m-a", "m-b", "renamed", "stable"]
    for ident in (key("ep-a"), key("ep-b"), key("ep-b", model="m-b")):
        for name in visible_models(CAT, ident):
            resolve(CAT, ident, name)  # every listed name is usable


def test_a_call_without_a_model_goes_to_the_only_endpoint_or_is_refused():
    assert endpoint_without_model(key("ep-b")) == "ep-b"
    assert endpoint_without_model(Identity("oidc", "s", None, endpoints=("ep-a",))) == "ep-a"
    for eps in (("*",), ("ep-a", "ep-b"), None):
        with pytest.raises(InvalidInput):
            endpoint_without_model(Identity("oidc", "s", None, endpoints=eps))


def test_models_page_carries_each_models_description_through_aliases_and_adapters():
    import json

    from gateway.model_routing import models_page

    cat = Catalogue({"ep-a": "m-a", "ep-b": "m-b"}, {"stable": ("ep-a", None)}, {"m-a-lora": "m-a"},
                    {"m-a": "support chat, 8B"})
    page = json.loads(models_page(cat, visible_models(cat, key("ep-a"))))
    assert {m["id"]: m.get("description") for m in page["data"]} == {
        "m-a": "support chat, 8B", "m-a-lora": "support chat, 8B", "stable": "support chat, 8B"}
    # A model with no description carries no description field (the OpenAI shape, unchanged).
    assert "description" not in json.loads(models_page(cat, ["m-b"]))["data"][0]
