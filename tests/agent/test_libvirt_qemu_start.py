"""A GPU-less replica started for real on the QEMU driver (qemu:///system) through our
LibvirtDriver: QEMU takes the whole XML at start (q35 + OVMF pflash with an NVRAM made from the
template, memfd shared memory, virtiofsd spawned on the read-only bind mount of the model
directory, the seed cdrom, the tap on a bridge), and delete leaves nothing behind.

The domain is KVM where KVM really runs a guest (agent.hw.kvm's probe, once per boot:
lab/rigs/kvm_verdict.py), else TCG, and the test prints why: a /dev/kvm that exists may be
a nested KVM that cannot take the host CPU model (QEMU aborts at start: `failed to set MSR
0x10a`) or a PVM KVM (QEMU pauses the guest: "emulation failure"). The guest OS is not booted
here; a real boot (direct kernel boot, our seed, virtiofs, the engine unit, /health) is
tests/agent/test_vm_boot.py (bounded) and scripts/vm-boot-check (in full); docs/gpu-hosts.md
says what each proves.

The bridge and the tap live in the host's namespace (libvirtd opens the tap there), uniquely
named, with no address and no traffic; both are removed at the end.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import libvirt
import pytest

from agent.net.bridge import BridgeNetwork
from agent.vm.base import VmSpec
from agent.vm.domain_xml import domain_name, tap_name
from agent.vm.libvirt_driver import LibvirtDriver
from agent.vm.ro_bind import mount_options
from lab.rigs.kvm_verdict import choose_domain_type, host_probe
from lab.rigs.polling import wait_for

REPO = Path(__file__).resolve().parents[2]

@pytest.fixture
def workdir():
    up = subprocess.run([str(REPO / "scripts/libvirtd-up.sh")], capture_output=True, text=True, timeout=120)
    assert up.returncode == 0, up.stderr
    # Under /var/lib/libvirt/images: QEMU runs as libvirt-qemu and cannot enter pytest's 0700 tmp.
    base = Path(f"/var/lib/libvirt/images/fabric-test-{os.getpid()}")
    base.mkdir(parents=True)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def test_gpu_less_replica_starts_on_qemu_and_delete_leaves_nothing(workdir, capsys):
    with capsys.disabled():
        domain_type, verdict = choose_domain_type(host_probe())
    golden = workdir / "golden.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(golden), "1G"], check=True)
    (workdir / "models/org/m").mkdir(parents=True)
    (workdir / "models/org/m/config.json").write_text('{"num_attention_heads": 8}')
    network = BridgeNetwork(f"fabtb{os.getpid() % 100000}")
    driver = LibvirtDriver("qemu:///system", image=golden, state_dir=workdir / "vms", models_dir=workdir / "models",
                           network=network, hugepages="off", numa="off", domain_type=domain_type)
    spec = VmSpec(replica_id=f"start-{os.getpid()}", deployment="d", model_name="m", model_source="hf://org/m",
                  cpu=1, memory_gib=0.5)
    ro_ok, _why = driver.readonly_mode()
    share = driver.share_dir(spec.replica_id)
    try:
        status = driver.create(spec)
        assert status.state in ("running", "starting"), status.message

        def virtiofsd() -> str:
            daemons = subprocess.run(["pgrep", "-a", "virtiofsd"], capture_output=True, text=True).stdout
            return daemons if spec.replica_id in daemons else ""

        daemons = wait_for(virtiofsd, 30, f"virtiofsd of {spec.replica_id}", interval=0.2)
        if not ro_ok:
            assert f"source={share}" in daemons  # virtiofsd exports the read-only bind mount
            assert mount_options(share.resolve(), Path("/proc/self/mountinfo").read_text()).split(",")[0] == "ro"
        conn = libvirt.open("qemu:///system")
        dom = conn.lookupByName(domain_name(spec.replica_id))
        assert dom.isActive(), verdict.reason
        assert f"type='{domain_type}'" in dom.XMLDesc(0).split("\n")[0]
        assert driver.paths(spec.replica_id).nvram.exists()  # libvirt made it from the vars template
        assert network.master_of(tap_name(spec.replica_id)) == network.bridge
    finally:
        driver.delete(spec.replica_id)
        subprocess.run(["ip", "link", "del", network.bridge], capture_output=True)
    assert driver.get(spec.replica_id) is None
    # The console log (agent.vm.libvirt_driver.log_path) is kept on purpose for `fabricctl ai logs`.
    assert not share.exists() and [p.name for p in (workdir / "vms").iterdir()] in ([], ["console"])
    assert spec.replica_id not in subprocess.run(["pgrep", "-a", "virtiofsd"], capture_output=True, text=True).stdout
