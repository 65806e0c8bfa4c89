"""Fixtures for the shared-package tests: a real etcd (session-wide) and a store per backend.

The etcd backend is the secured server (TLS with client certificates, auth on) and the store logs
in as fabricd, whose role holds /fabric/: each test's prefix lives under it."""

from __future__ import annotations

import uuid

import pytest

from common.store.etcd_store import EtcdStore
from common.store.sqlite_store import SqliteStore
from lab.rigs.etcd_server import etcd_server  # noqa: F401  (a fixture, used by name)


@pytest.fixture(params=["sqlite", "etcd"])
def backend(request, tmp_path) -> dict:
    """How to reach one store backend: {'kind', 'url', 'access', 'prefix'}; each test gets its own prefix.

    etcd is one server for the session, so tests isolate by key prefix rather than by server.
    """
    prefix = f"/fabric/t/{uuid.uuid4().hex[:12]}/"
    if request.param == "sqlite":
        return {"kind": "sqlite", "url": f"sqlite://{tmp_path / 'fabric.db'}", "access": None, "prefix": prefix}
    server = request.getfixturevalue("etcd_server")
    return {"kind": "etcd", "url": server.url, "access": server.access("fabricd"), "prefix": prefix}


@pytest.fixture
def store(backend):
    from common.store import open_store

    opened = open_store(backend["url"], access=backend["access"])
    assert isinstance(opened, (SqliteStore, EtcdStore))
    yield opened
    opened.close()


@pytest.fixture
def ns(backend) -> str:
    return backend["prefix"]
