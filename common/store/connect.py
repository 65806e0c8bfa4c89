"""``open_store(url, state_dir)``: the one way a process opens its store (sqlite:// or etcd://).

Its own module so that the contract (common.store.base) imports neither backend: the backends
import the contract, and this module imports them.
"""

from __future__ import annotations

from pathlib import Path

from common.store.base import Store
from common.store.etcd_access import EtcdAccess, check_plain


def open_store(url: str | None, state_dir: str | Path | None = None, *,
               access: EtcdAccess | None = None, insecure: bool = False) -> Store:
    """The store at `url`. `access` is how to reach etcd (common.store.etcd_access: TLS files and
    login from FABRIC_ETCD_*); plain HTTP to an etcd off loopback is refused (ValueError) unless
    `insecure` (the operator's --insecure-store)."""
    if access is not None and not (url or "").startswith("etcd://"):
        raise ValueError("FABRIC_ETCD_* is set but the store is not etcd (pass --store etcd://HOST:PORT,...)")
    if url is None or url == "" or url == "sqlite":
        if state_dir is None:
            raise ValueError("the embedded store needs a state directory")
        from common.store.sqlite_store import SqliteStore

        return SqliteStore(Path(state_dir) / "fabric.db")
    if url.startswith("sqlite://"):
        from common.store.sqlite_store import SqliteStore

        return SqliteStore(Path(url[len("sqlite://"):]))
    if url.startswith("etcd://"):
        from common.store.etcd_store import EtcdStore

        endpoints = etcd_endpoints(url)
        check_plain(url, [h for h, _ in endpoints], access, insecure=insecure)
        return EtcdStore(endpoints[0][0], endpoints[0][1], endpoints=endpoints, access=access)
    raise ValueError(f"store URL {url!r}: expected sqlite:///PATH or etcd://HOST:PORT[,HOST:PORT...]")


def etcd_endpoints(url: str) -> list[tuple[str, int]]:
    """``etcd://H1:P1,H2:P2`` -> [(H1, P1), (H2, P2)]; ValueError naming the URL when malformed."""
    endpoints = []
    for hostport in url[len("etcd://"):].rstrip("/").split(","):
        host, _, port = hostport.strip().rpartition(":")
        if not url.startswith("etcd://") or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"store URL {url!r}: expected etcd://HOST:PORT[,HOST:PORT...]")
        endpoints.append((host, int(port)))
    return endpoints
