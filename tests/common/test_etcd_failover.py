"""EtcdStore with several endpoints (etcd://A,B,C): a member whose connection is refused is
skipped and the next one serves the call; every endpoint down is a TransientError naming the
endpoint and the cluster; bad lists are refused when the URL is parsed."""

from __future__ import annotations

import pytest

from common.errors import TransientError
from common.store.connect import open_store
from common.store.etcd_store import EtcdStore
from lab.rigs.servers import free_port


def test_a_refused_endpoint_is_skipped_and_the_next_one_serves(etcd_server):
    live = int(etcd_server.url.rsplit(":", 1)[1])
    dead = free_port()
    store = open_store(f"etcd://127.0.0.1:{dead},127.0.0.1:{live}", access=etcd_server.access("fabricd"))
    assert isinstance(store, EtcdStore) and store.port == dead
    rev = store.put("/fabric/failover/x", "1")
    assert store.port == live  # the live member became current
    assert store.create("/fabric/failover/y", "2")  # a create goes through once, not twice
    assert store.get("/fabric/failover/x").mod_revision == rev
    assert [kv.key for kv in store.list("/fabric/failover/")] == ["/fabric/failover/x", "/fabric/failover/y"]
    assert store.delete_prefix("/fabric/failover/") == 2
    store.close()


def test_every_endpoint_down_is_transient_and_names_the_cluster():
    store = open_store(f"etcd://127.0.0.1:{free_port()},127.0.0.1:{free_port()},127.0.0.1:{free_port()}")
    with pytest.raises(TransientError) as err:
        store.get("/fabric/x")
    assert err.value.status == 503
    assert "unreachable" in err.value.message and "etcd cluster of 3 endpoints" in err.value.message
    with pytest.raises(TransientError):
        store.watch("/fabric/", 0, 0.2)
    store.close()


@pytest.mark.parametrize("url", ["etcd://127.0.0.1:1,", "etcd://127.0.0.1:1,nohost", "etcd://a:1,b:99999",
                                 "etcd://a:1,:2"])
def test_bad_endpoint_lists_are_refused(url):
    with pytest.raises(ValueError, match="HOST:PORT"):
        open_store(url)
