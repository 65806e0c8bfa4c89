"""Which rtnetlink messages invalidate only the forwarding cache and which make
the agent re-read the device and bridge-FDB maps too (agent/dataplane/fibwatch.py)."""

import socket

from agent.dataplane.fibwatch import RTM_DELLINK, RTM_DELNEIGH, RTM_NEWLINK, RTM_NEWNEIGH, classify

RTM_NEWROUTE, RTM_NEWADDR, RTM_NEWRULE = 24, 20, 32


def test_classify():
    assert classify([]) == (False, False)
    assert classify([(RTM_NEWNEIGH, socket.AF_INET)]) == (True, False)  # an ARP entry: cache only
    assert classify([(RTM_NEWROUTE, socket.AF_INET), (RTM_NEWADDR, socket.AF_INET)]) == (True, False)
    assert classify([(RTM_NEWRULE, socket.AF_INET)]) == (True, False)
    assert classify([(RTM_NEWNEIGH, socket.AF_BRIDGE)]) == (True, True)  # an FDB entry
    assert classify([(RTM_DELNEIGH, socket.AF_BRIDGE)]) == (True, True)
    assert classify([(RTM_NEWROUTE, socket.AF_INET), (RTM_NEWLINK, socket.AF_UNSPEC)]) == (True, True)
    assert classify([(RTM_DELLINK, socket.AF_UNSPEC)]) == (True, True)
