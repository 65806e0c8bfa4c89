"""Deployment records (/fabric/deployments/<name>): typed reads and validated writes."""

from __future__ import annotations

from collections.abc import Callable

from common import keyspace
from common.errors import Conflict, NotFound
from common.schemas import InferenceDeployment
from common.store.base import Store
from controlplane.records import cas

KIND = "deployment"


def get(store: Store, name: str) -> InferenceDeployment | None:
    kv = store.get(keyspace.deployments(name))
    return None if kv is None else cas.parse(InferenceDeployment, kv.value)


def list(store: Store) -> list[InferenceDeployment]:  # noqa: A001 - the module's verb
    return [cas.parse(InferenceDeployment, kv.value) for kv in store.list(keyspace.deployments())]


def create(store: Store, dep: InferenceDeployment) -> InferenceDeployment:
    """Create-if-absent; Conflict when a deployment of that name exists."""
    dep = InferenceDeployment.model_validate(dep.model_dump(), context={"stored": True})
    if not store.create(keyspace.deployments(dep.name), dep.model_dump_json()):
        raise Conflict(f"deployment {dep.name!r} already exists", code="exists")
    return dep


def update(store: Store, name: str, mutate: Callable[[InferenceDeployment], InferenceDeployment | None],
           retries: int = cas.RETRIES) -> InferenceDeployment:
    return cas.update(store, keyspace.deployments(name), InferenceDeployment, mutate, kind=KIND, name=name,
                      retries=retries)


def delete(store: Store, name: str) -> None:
    if not store.delete(keyspace.deployments(name)):
        raise NotFound(f"deployment {name!r} not found")
