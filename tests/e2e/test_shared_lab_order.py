"""The e2e conftest's collection order: the modules that share one lab run next to each other,
in file order, where the first of them stood; every other test keeps its place."""

from __future__ import annotations

from types import SimpleNamespace

from tests.e2e.conftest import pytest_collection_modifyitems


def _item(name: str, shares: bool) -> SimpleNamespace:
    return SimpleNamespace(name=name, fixturenames=["shared_lab"] if shares else ["tmp_path"])


def test_sharing_modules_are_grouped_where_the_first_stood():
    items = [_item("cli", False), _item("nodrop", True), _item("real1", False), _item("rollout", True),
             _item("real2", False), _item("story", True), _item("other", False)]
    pytest_collection_modifyitems(items)
    assert [i.name for i in items] == ["cli", "nodrop", "rollout", "story", "real1", "real2", "other"]


def test_no_sharing_module_leaves_the_order_alone():
    items = [_item("b", False), _item("a", False)]
    pytest_collection_modifyitems(items)
    assert [i.name for i in items] == ["b", "a"]
