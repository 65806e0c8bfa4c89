"""The per-endpoint name index of API keys on both stores (SQLite and a real etcd): the claim is
one create-all with the record, a losing create writes nothing, a delete frees the name, and an
index entry left by a delete that stopped half-way does not block the name forever."""

from __future__ import annotations

import uuid

import pytest

from common import apikeys, keyspace
from common.errors import Conflict
from common.records import api_keys

SECRET = b"s" * 32


def spec(endpoint: str, name: str = "k") -> apikeys.KeySpec:
    return apikeys.KeySpec(name=name, endpoint=endpoint)


def test_a_second_key_of_the_same_name_writes_nothing_and_delete_frees_it(store):
    ep = f"ep-{uuid.uuid4().hex[:8]}"
    first, _ = apikeys.create_key(store, spec(ep, "a/b c"), SECRET)  # any name; the index encodes it
    loser, _ = apikeys.build_record(spec(ep, "a/b c"), SECRET)
    with pytest.raises(Conflict) as refused:
        api_keys.save_new(store, loser)
    assert refused.value.code == "already_exists"
    assert store.get(keyspace.api_keys(loser.id)) is None
    assert store.get(keyspace.api_key_prefixes(loser.prefix)) is None
    assert store.get(keyspace.api_key_names(ep, "a/b c")).value == first.id
    other, _ = apikeys.create_key(store, spec(f"{ep}-2", "a/b c"), SECRET)  # another endpoint: fine
    api_keys.delete(store, first.id)
    assert store.get(keyspace.api_key_names(ep, "a/b c")) is None
    assert store.get(keyspace.api_key_names(f"{ep}-2", "a/b c")).value == other.id
    again, _ = apikeys.create_key(store, spec(ep, "a/b c"), SECRET)
    assert store.get(keyspace.api_key_names(ep, "a/b c")).value == again.id
    for rec in (other, again):
        api_keys.delete(store, rec.id)


def test_a_name_left_behind_by_a_half_done_delete_is_reclaimed(store):
    ep = f"ep-{uuid.uuid4().hex[:8]}"
    old, _ = apikeys.create_key(store, spec(ep), SECRET)
    store.delete(keyspace.api_keys(old.id))  # the delete stopped after removing the record
    new, _ = apikeys.create_key(store, spec(ep), SECRET)
    assert store.get(keyspace.api_key_names(ep, "k")).value == new.id
    store.delete(keyspace.api_key_prefixes(old.prefix))
    api_keys.delete(store, new.id)
    assert store.get(keyspace.api_key_names(ep, "k")) is None
