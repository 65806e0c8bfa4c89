"""A bounded packet fuzz of the real XDP and TC programs (lab/rigs/packet_fuzz.py says what
is generated and checked; scripts/fuzz-packets runs the long profile). Fixed seed: the same
frames every run."""

from __future__ import annotations

from lab.rigs.packet_fuzz import fuzz, setup_services

FRAMES = 400


def test_mutated_frames_get_defined_verdicts_and_invalid_ones_make_no_flows(snat_plane):
    # the session's shared plane (node_ip set, so the source-NAT paths are reachable), own VIP
    setup_services(snat_plane)
    report = fuzz(snat_plane, seed=20, count=FRAMES)
    print(report)
    assert report.problems == []
    assert report.frames == FRAMES
    # the run reached what it means to test: every mutation, invalid frames, and real forwarding
    assert len(report.mutations) == 10 and sum(report.invalid.values()) >= FRAMES // 5, report
    assert report.verdicts.get("fwd_new_flow", 0) > 0 and report.flows_created > 0, report
    assert {"drop_truncated", "drop_fragment", "drop_ip_options"} <= set(report.verdicts), report
