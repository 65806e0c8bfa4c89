"""common.records.cas.swap (the one CAS loop on a raw value) and Records.update_status."""

import pytest

from common.records import cas
from common.records import endpoints as eps
from common.schemas import InferenceEndpoint


def test_swap_creates_an_absent_key_changes_it_and_leaves_it(store):
    def bump(kv):
        return str(int(kv.value) + 1) if kv is not None else "1"

    assert cas.swap(store, "/t/counter", bump) is True
    assert cas.swap(store, "/t/counter", bump) is True
    assert store.get("/t/counter").value == "2"
    assert cas.swap(store, "/t/counter", lambda kv: None) is False
    assert store.get("/t/counter").value == "2"


def test_swap_loses_every_race_then_is_contended(store):
    store.put("/t/k", "a")

    def racing(kv):
        store.put("/t/k", "other")  # another writer wins between our read and our CAS
        return "mine"

    with pytest.raises(cas.Contended) as exc:
        cas.swap(store, "/t/k", racing, busy="k kept changing")
    assert exc.value.message == "k kept changing"
    assert store.get("/t/k").value == "other"


def test_update_status_writes_only_a_change(store):
    eps.create(store, InferenceEndpoint(name="chat", deployment="chat"))
    rev = store.get(eps.RECORDS.key("chat")).mod_revision
    eps.update_status(store, "chat", phase="Pending")  # already Pending: no write
    assert store.get(eps.RECORDS.key("chat")).mod_revision == rev
    assert eps.update_status(store, "chat", phase="Ready", vip="10.0.0.9").status.vip == "10.0.0.9"
    assert eps.require(store, "chat").status.phase == "Ready"
