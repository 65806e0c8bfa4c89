"""scripts/xdp_traffic.py's summary (pure): a ratio is the median of per-round pairs
(VIP and direct measured back to back), reported with its spread; the medians of
the figures themselves keep their names."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import xdp_traffic  # noqa: E402


def test_ratio_is_the_median_of_pairs_not_of_separate_medians():
    # round 0: a neighbour's burst slowed the VIP half only; rounds 1-2: VIP at 0.95 of direct
    figures = {}
    for name in xdp_traffic.FIGURES:
        figures[f"{name}_direct"] = [100.0, 100.0, 60.0]
        figures[f"{name}_vip"] = [60.0, 95.0, 57.0]
    figures["dsr_down_nat"] = [10.0, 20.0, 30.0]
    figures["dsr_down_dsr"] = [5.0, 20.0, 33.0]
    figures["dsr_down_nat_lb_packets_per_gbit"] = [1.0, 2.0, 3.0]
    out = xdp_traffic.summarize(figures)
    # separate medians would say 60 / 100 = 0.6
    assert out["udp_1_flow_pps_ratio"] == 0.95
    assert (out["udp_1_flow_pps_ratio_min"], out["udp_1_flow_pps_ratio_max"]) == (0.6, 0.95)
    assert out["new_connections_per_s_ratios"] == [0.6, 0.95, 0.95]
    assert out["tcp_4_streams_down_vip_bps"] == 60 and out["tcp_4_streams_down_direct_bps"] == 100
    assert out["udp_1_flow_pps_vip"] == 60
    assert out["dsr_down_ratio_to_nat"] == 1.0 and out["dsr_down_nat_bps"] == 20
    assert out["dsr_down_nat_lb_packets_per_gbit"] == 2
