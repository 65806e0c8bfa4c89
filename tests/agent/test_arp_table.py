"""agent.net.arp_table: the guest address from /proc/net/arp text (libvirt 9.0's ARP source fails)."""

from __future__ import annotations

from agent.net.arp_table import arp_address, read_arp_address

ARP = """IP address       HW type     Flags       HW address            Mask     Device
192.0.2.1        0x1         0x2         02:fc:00:00:00:05     *        eth0
10.250.7.14      0x1         0x2         52:54:00:AA:bb:cc     *        fabvb1
10.250.9.20      0x1         0x2         52:54:00:aa:bb:cc     *        other0
10.250.7.15      0x1         0x0         52:54:00:dd:ee:ff     *        fabvb1
"""


def test_complete_entry_with_the_mac_on_the_bridge_wins_case_insensitively():
    assert arp_address(ARP, "52:54:00:aa:bb:cc", "fabvb1") == "10.250.7.14"
    assert arp_address(ARP, "52:54:00:aa:bb:cc", "other0") == "10.250.9.20"


def test_incomplete_unknown_or_malformed_entries_give_none():
    assert arp_address(ARP, "52:54:00:dd:ee:ff", "fabvb1") is None  # flags 0x0: no MAC resolved
    assert arp_address(ARP, "52:54:00:00:00:01") is None
    assert arp_address(ARP + "garbage line\n10.0.0.1 0x1 zz 52:54:00:00:00:01 * x\n", "52:54:00:00:00:01") is None


def test_reader_reads_the_file_and_tolerates_its_absence(tmp_path):
    table = tmp_path / "arp"
    table.write_text(ARP)
    assert read_arp_address("52:54:00:aa:bb:cc", "fabvb1", table) == "10.250.7.14"
    assert read_arp_address("52:54:00:aa:bb:cc", "fabvb1", tmp_path / "absent") is None
