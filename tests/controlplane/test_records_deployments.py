"""common.records: typed deployment reads, validated writes, and the one CAS helper."""

import pytest
from pydantic import ValidationError

from common import keyspace
from common.errors import Conflict, NotFound
from common.records import cas
from common.records import deployments as deps
from common.schemas import InferenceDeployment


def _dep(name="chat", **kw):
    return InferenceDeployment(name=name, model="qwen", profile="small", **kw)


def test_create_get_list_update_delete(store):
    deps.create(store, _dep())
    with pytest.raises(Conflict):
        deps.create(store, _dep())
    assert deps.get(store, "chat").replicas == 1
    assert [d.name for d in deps.list(store)] == ["chat"]

    def scale(d):
        d.replicas = 3
        return d

    assert deps.update(store, "chat", scale).replicas == 3
    assert deps.get(store, "chat").replicas == 3
    deps.delete(store, "chat")
    assert deps.get(store, "chat") is None
    with pytest.raises(NotFound):
        deps.update(store, "chat", scale)


def test_update_refuses_an_invalid_record_and_leaves_the_stored_one(store):
    deps.create(store, _dep())

    def bad(d):
        d.replicas = 1000  # above the schema's le=64
        return d

    with pytest.raises(ValidationError):
        deps.update(store, "chat", bad)
    assert deps.get(store, "chat").replicas == 1


def test_update_retries_a_lost_race_then_gives_up(store):
    deps.create(store, _dep())
    calls = []

    def racing(d):  # another writer changes the record between our read and our CAS
        calls.append(1)
        if len(calls) == 1:
            store.put(keyspace.deployments("chat"), _dep(replicas=2).model_dump_json())
        d.replicas = d.replicas + 1
        return d

    assert deps.update(store, "chat", racing).replicas == 3  # applied to the winner's record
    assert len(calls) == 2

    def always_loses(d):
        store.put(keyspace.deployments("chat"), _dep(replicas=2).model_dump_json())
        d.replicas = 5
        return d

    with pytest.raises(cas.Contended):
        deps.update(store, "chat", always_loses)
    assert deps.get(store, "chat").replicas == 2
