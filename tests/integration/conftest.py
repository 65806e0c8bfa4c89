"""Fixtures shared by the integration tests: the real etcd server (skips when etcd is absent)."""

from lab.rigs.etcd_server import etcd_server  # noqa: F401  (a fixture, used by name)
