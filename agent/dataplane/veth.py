"""Make a veth end ready to exchange frames with an XDP program on its peer.

* XDP_REDIRECT / XDP_TX into a veth deliver only when the receiving end runs
  NAPI: an XDP program or GRO on that end. `gro on` is the cheaper of the two.
* A local sender on a veth hands the kernel packets whose TCP/UDP checksum is
  only partial (tx checksum offload: the skb carries "finish me" metadata). An
  XDP program sees raw bytes and a frame it redirects loses that metadata, so
  the receiver finds a bad checksum and drops it. Real NICs deliver complete
  checksums; in the lab, senders whose packets reach XDP turn tx offload off.

The lab (lab/topology.py, agent/vm/lab_driver.py) and the
dataplane tests call this on every veth end facing the node.
"""

from __future__ import annotations

import subprocess


def prepare_veth_end(netns: str | None, dev: str) -> None:
    """GRO on (NAPI for XDP frames) and tx checksum offload off on `dev` in `netns`."""
    prefix = ["ip", "netns", "exec", netns] if netns else []
    subprocess.run([*prefix, "ethtool", "-K", dev, "gro", "on", "tx", "off"], check=True, capture_output=True,
                   timeout=30)
