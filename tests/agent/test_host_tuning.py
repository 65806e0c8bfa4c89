"""Host tuning decisions from plain text (pure) and the HGX shape rule."""

from __future__ import annotations

import pytest

from agent.hw.pci_sysfs import nvidia_functions, parse_resource
from agent.hw.sysfs_fake import FakeSysfs
from agent.vm.host_tuning import (
    choose_hugepages,
    choose_numa,
    parse_cpulist,
    plan_tuning,
    readonly_share_supported,
    virtiofsd_version,
)
from common.errors import InvalidInput


def test_hugepages_prefer_1g_then_2m_then_none():
    assert choose_hugepages("auto", {1_048_576: 64, 2048: 1000})[0] == 1_048_576
    assert choose_hugepages("auto", {1_048_576: 0, 2048: 1000})[0] == 2048
    size, why = choose_hugepages("auto", {1_048_576: 0, 2048: 0})
    assert size == 0 and "memfd" in why
    assert choose_hugepages("2M", {})[0] == 2048 and choose_hugepages("off", {1_048_576: 8})[0] == 0
    with pytest.raises(InvalidInput):
        choose_hugepages("3M", {})


def test_numa_node_only_when_all_gpus_agree():
    cpus = {0: (0, 1), 1: (2, 3)}
    assert choose_numa([1, 1], cpus)[0] == 1
    node, why = choose_numa([0, 1], cpus)
    assert node is None and "0, 1" in why
    assert choose_numa([-1], cpus)[0] is None and choose_numa([4], cpus)[0] is None
    assert parse_cpulist("0-3,8,10-11\n") == (0, 1, 2, 3, 8, 10, 11)


def test_readonly_virtiofs_needs_libvirt_11_and_rust_virtiofsd_1_13():
    assert virtiofsd_version("virtiofsd version 7.2.22 (Debian 1:7.2+dfsg-7)") == ("c", (7, 2, 22))
    assert virtiofsd_version("virtiofsd 1.13.0") == ("rust", (1, 13, 0))
    assert readonly_share_supported(11_000_000, "virtiofsd 1.13.0")[0]
    assert not readonly_share_supported(10_000_000, "virtiofsd 1.13.0")[0]  # Ubuntu 24.04
    assert not readonly_share_supported(11_002_000, "virtiofsd 1.10.1")[0]
    assert not readonly_share_supported(9_000_000, "virtiofsd version 7.2.22")[0]  # Debian 12


def test_bar_sizes_from_a_resource_file():
    text = ("0x00000000fa000000 0x00000000faffffff 0x0000000000040200\n"
            "0x0000200000000000 0x0000201fffffffff 0x000000000014220c\n"
            "0x0000000000000000 0x0000000000000000 0x0000000000000000\n"
            "0x0000202000000000 0x0000202001ffffff 0x000000000014220c\n")
    bars, total64 = parse_resource(text)
    assert bars[:4] == (16, 128 * 1024, 0, 32) and total64 == 128 * 1024 + 32


def hgx(tmp_path):
    fake = FakeSysfs(tmp_path / "sys")
    for i in range(8):
        fake.add_gpu(f"0000:{0x10 + i:02x}:00.0", group=i, device_id="0x2335", numa_node=i // 4)
    for i in range(4):
        fake.add_nvswitch(f"0000:{0x05 + i:02x}:00.0", group=40 + i)
    return nvidia_functions(fake.root)


def test_hgx_full_passthrough_takes_the_switches_and_partial_shapes_are_refused(tmp_path):
    fns = hgx(tmp_path)
    gpus = tuple(f.bdf for f in fns if f.is_gpu)
    kw = {"hugepages": "off", "numa": "auto", "pools": {}, "node_cpus": {0: (0, 1), 1: (2, 3)},
          "readonly": (False, "bind")}
    full = plan_tuning(gpus, fns, **kw)
    assert full.nvswitches == ("0000:05:00.0", "0000:06:00.0", "0000:07:00.0", "0000:08:00.0")
    assert full.numa_node is None  # the board spans two NUMA nodes
    assert full.mmio64_mib >= 2 * 8 * 256 * 1024
    single = plan_tuning(gpus[5:6], fns, **kw)
    assert single.nvswitches == () and single.numa_node == 1 and single.host_cpus == (2, 3)
    with pytest.raises(InvalidInput, match="1 GPU or all 8"):
        plan_tuning(gpus[:4], fns, **kw)


def test_the_planner_does_not_import_the_renderer():
    """host_tuning (the planner) and domain_xml (the renderer) share the aperture rule through
    agent/vm/mmio.py; the planner imports nothing from the renderer."""
    import ast
    from pathlib import Path

    from agent.vm import host_tuning

    tree = ast.parse(Path(host_tuning.__file__).read_text())
    modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "agent.vm.domain_xml" not in modules and "agent.vm.mmio" in modules
