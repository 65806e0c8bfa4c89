"""The three-member cluster docs/install.md prescribes, secured: members talk over peer TLS with
certificates from the etcd CA, clients over TLS with a login, and the store fails over between
members without losing either."""

from __future__ import annotations

import json
import urllib.request

import pytest

from common.errors import StoreAccessDenied, TransientError
from lab.rigs.etcd_cluster import EtcdCluster
from lab.rigs.etcd_server import ETCD_BINARY, etcd_available
from lab.rigs.polling import wait_for

pytestmark = pytest.mark.skipif(not etcd_available(), reason=f"etcd binary not found at {ETCD_BINARY}")


def members(cluster: EtcdCluster, i: int) -> list[dict]:
    m = cluster.members[i]
    req = urllib.request.Request(f"{m.client}/v3/cluster/member/list", data=b"{}", method="POST",
                                 headers={"authorization": cluster._root_token(m)})
    with urllib.request.urlopen(req, timeout=5, context=cluster._ctx) as resp:
        return json.loads(resp.read())["members"]


def test_a_secured_cluster_keeps_serving_through_a_member_loss():
    with EtcdCluster(3) as cluster:
        listed = members(cluster, 0)
        assert len(listed) == 3
        assert all(u.startswith("https://") for m in listed for u in m["peerURLs"] + m["clientURLs"])
        fabricd = cluster.open("fabricd")
        rev = fabricd.put("/fabric/models/m", "{}")
        victim = cluster.leader()
        cluster.kill(victim)
        # the store moves to a live member; the write made before the loss is there
        def moved() -> bool:
            try:
                assert fabricd.get("/fabric/models/m").mod_revision == rev
                assert fabricd.put("/fabric/models/n", "{}") > rev
                return True
            except TransientError:  # no leader yet: etcd answers after its election
                return False

        wait_for(moved, 30, "the store to answer from a live member", interval=0.2)
        cluster.restart(victim)  # rejoins over peer TLS
        assert cluster.wait_healthy(30)
        gateway = cluster.open("gateway")
        assert gateway.get("/fabric/models/n").value == "{}"
        with pytest.raises(StoreAccessDenied, match="may not kv/put /fabric/models/n"):
            gateway.put("/fabric/models/n", "forged")
        fabricd.close()
        gateway.close()
