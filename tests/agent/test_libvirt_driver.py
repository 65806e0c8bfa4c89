"""The libvirt driver against libvirt's test:///default, with real qcow2 overlays
(qemu-img), a real cidata ISO, and real taps on a bridge inside a namespace the test makes.

test:///default keeps every element our XML uses except <qemu:commandline> (hypervisor-
specific namespaces belong to the QEMU driver), so the round trip compares everything
else and the MMIO argument is covered structurally in test_domain_xml.py.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import ipaddress
import itertools
import os
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import libvirt
import pycdlib
import pytest

from agent.net.bridge import BridgeNetwork
from agent.vm.base import VmSpec
from agent.vm.cloud_init import build_seed
from agent.vm.domain_xml import mac_for, tap_name
from agent.vm.libvirt_driver import LibvirtDriver
from agent.vm.overlay import backing_file
from agent.vm.ro_bind import mount_options
from common.errors import InvalidInput, NotFound

pytestmark = [
    pytest.mark.skipif(shutil.which("qemu-img") is None, reason="qemu-img (qemu-utils) not installed"),
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a network namespace for the taps"),
]

_names = itertools.count()


@pytest.fixture
def netns():
    from pyroute2 import netns as nsapi

    name = f"fabtlv-{os.getpid()}-{next(_names)}"
    nsapi.create(name)
    try:
        yield name
    finally:
        nsapi.remove(name)


@pytest.fixture
def host(tmp_path, netns):
    golden = tmp_path / "golden.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(golden), "1G"], check=True)
    models = tmp_path / "models"
    (models / "meta-llama/Llama-3.1-8B").mkdir(parents=True)
    network = BridgeNetwork("fabric0", netns=netns)
    driver = LibvirtDriver(
        "test:///default", image=golden, state_dir=tmp_path / "vms", models_dir=models, network=network
    )
    yield driver, golden, network
    for status in driver.list():
        driver.delete(status.id)


def spec(replica_id: str, gpus=("0000:3b:00.0",)) -> VmSpec:
    return VmSpec(
        replica_id=replica_id,
        deployment="llama",
        model_name="llama-8b",
        model_source="hf://meta-llama/Llama-3.1-8B",
        gpus=gpus,
        gpu_memory_mib=81_559,
        cpu=4,
        memory_gib=16,
    )


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def iso_file(path: Path, name: str) -> str:
    iso = pycdlib.PyCdlib()
    iso.open(str(path))
    try:
        out = io.BytesIO()
        iso.get_file_from_iso_fp(out, rr_path="/" + name)
        return out.getvalue().decode()
    finally:
        iso.close()


def iso_label(path: Path) -> str:
    iso = pycdlib.PyCdlib()
    iso.open(str(path))
    try:
        return iso.pvd.volume_identifier.decode().strip()
    finally:
        iso.close()


def test_create_get_list_delete(host, monkeypatch):
    driver, golden, network = host
    monkeypatch.setenv("HF_TOKEN", "hf_supersecretvalue123")
    golden_before = sha256(golden)

    status = driver.create(spec("lv-a"))
    assert status.state == "running" and status.port == 8000
    assert status.host is not None and ipaddress.ip_address(status.host).version == 4

    paths = driver.paths("lv-a")
    assert backing_file(paths.overlay) == str(golden.resolve())
    assert iso_label(paths.seed) == "cidata"
    user = iso_file(paths.seed, "user-data")
    assert "--tensor-parallel-size 1" in user and "/models/meta-llama/Llama-3.1-8B" in user
    assert "fabric-lv-a" in iso_file(paths.seed, "meta-data")
    for path in (paths.seed, paths.overlay):
        assert b"hf_supersecretvalue123" not in path.read_bytes()
    assert network.master_of(tap_name("lv-a")) == "fabric0"

    assert driver.create(spec("lv-a")).state == "running"  # idempotent by replica id
    assert [s.id for s in driver.list()] == ["lv-a"]  # libvirt's own "test" domain is not ours
    assert driver.get("lv-a").host == status.host

    assert driver.delete("lv-a") is True
    assert driver.get("lv-a") is None and driver.state("lv-a") == "absent"
    assert not paths.overlay.exists() and not paths.seed.exists()
    with pytest.raises(NotFound):
        network.master_of(tap_name("lv-a"))
    assert driver.delete("lv-a") is False
    assert sha256(golden) == golden_before  # the golden image is never written


def test_lifecycle_steps_and_round_trip(host):
    driver, _golden, _network = host
    s = spec("lv-b", gpus=("0000:3b:00.0", "0000:c1:00.0"))
    driver.define(s)
    assert driver.state("lv-b") == "stopped"
    driver.start("lv-b")
    assert driver.state("lv-b") == "running"
    driver.start("lv-b")  # already running: no error
    assert driver.destroy("lv-b") is True and driver.state("lv-b") == "stopped"
    assert driver.destroy("lv-b") is False

    conn = libvirt.open("test:///default")
    stored = ET.fromstring(conn.lookupByName("fabric-lv-b").XMLDesc(0))
    ours = ET.fromstring(driver.domain_xml(s))
    for path in (
        "os/type",
        "os/loader",
        "os/nvram",
        "cpu",
        "cpu/maxphysaddr",
        "memoryBacking/access",
        "devices/filesystem/driver",
        "devices/interface/target",
        "devices/interface/mac",
    ):
        assert stored.find(path).attrib == ours.find(path).attrib, path
    assert stored.find("os/loader").text == ours.find("os/loader").text
    # libvirt 9 cannot export virtiofs read-only: the share is a read-only bind mount instead.
    ro_ok, _why = driver.readonly_mode()
    share = driver.share_dir("lv-b")
    if not ro_ok:
        assert stored.find("devices/filesystem/readonly") is None
        assert stored.find("devices/filesystem/source").get("dir") == str(share)
        assert mount_options(share.resolve(), Path("/proc/self/mountinfo").read_text()).split(",")[0] == "ro"
        with pytest.raises(OSError):
            (share / "written-by-guest").write_text("x")  # EROFS from the host kernel
        assert (share / "meta-llama/Llama-3.1-8B").is_dir()
    hostdevs = stored.findall("devices/hostdev")
    assert [h.find("source/address").get("bus") for h in hostdevs] == ["0x3b", "0xc1"]
    assert all(h.get("managed") == "no" for h in hostdevs)
    assert len([c for c in stored.findall("devices/controller") if c.get("model") == "pcie-root-port"]) == 2
    assert stored.find("devices/interface/mac").get("address") == mac_for("lv-b")
    assert "lv-b" in ET.tostring(stored.find("metadata"), encoding="unicode")

    assert driver.undefine("lv-b") is True and driver.state("lv-b") == "absent"
    assert driver.undefine("lv-b") is False
    driver.delete("lv-b")
    assert not share.exists()  # unmounted and removed


def test_failed_create_leaves_nothing(tmp_path, netns):
    network = BridgeNetwork("fabric0", netns=netns)
    driver = LibvirtDriver(
        "test:///default",
        image=tmp_path / "missing.qcow2",
        state_dir=tmp_path / "vms",
        models_dir=tmp_path,
        network=network,
    )
    with pytest.raises(NotFound, match="golden image"):
        driver.create(spec("lv-c"))
    assert driver.get("lv-c") is None
    assert sorted((tmp_path / "vms").glob("*")) == []  # glob of a missing dir is empty too
    with pytest.raises(NotFound):
        network.master_of(tap_name("lv-c"))


def test_bad_replica_id_is_invalid(host):
    driver, _golden, _network = host
    with pytest.raises(InvalidInput, match="replica id"):
        driver.create(spec("Bad/Id"))


def test_seed_user_data_content(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_TOKEN", "hf_anothersecret987")
    s = spec("lv-d", gpus=("0000:3b:00.0", "0000:3c:00.0", "0000:3d:00.0", "0000:3e:00.0"))
    meta, user = build_seed(s, hostname="fabric-lv-d", models_dir=tmp_path)
    assert "hf_anothersecret987" not in meta + user
    assert user.startswith("#cloud-config\n")
    import yaml

    config = yaml.safe_load(user)
    unit = next(f for f in config["write_files"] if f["path"] == "/etc/systemd/system/fabric-engine.service")[
        "content"
    ]
    assert (
        "serve /models/meta-llama/Llama-3.1-8B --served-model-name llama-8b --host 0.0.0.0 "
        "--port 8000 --kv-events-config "
    ) in unit and "--tensor-parallel-size 4" in unit
    assert ["models", "/models", "virtiofs", "ro,nofail", "0", "0"] in config["mounts"]
    assert ["systemctl", "enable", "--now", "fabric-engine.service"] in config["runcmd"]
    assert yaml.safe_load(meta)["instance-id"] == "fabric-lv-d"


def test_seed_refuses_credentials_in_engine_flags(tmp_path):
    s = VmSpec(
        replica_id="lv-e",
        deployment="d",
        model_name="m",
        model_source="hf://o/m",
        extra_args=("--api-key=abc123456",),
    )
    with pytest.raises(InvalidInput, match="--api-key"):
        build_seed(s, hostname="fabric-lv-e")


def test_host_model_path_must_be_in_the_share(tmp_path):
    s = VmSpec(replica_id="lv-f", deployment="d", model_name="m", model_source="/elsewhere/m")
    with pytest.raises(InvalidInput, match="shared model directory"):
        build_seed(s, hostname="fabric-lv-f", models_dir=tmp_path)
    ok = VmSpec(replica_id="lv-f", deployment="d", model_name="m", model_source=f"file://{tmp_path}/org/m")
    assert "serve /models/org/m " in build_seed(ok, hostname="fabric-lv-f", models_dir=tmp_path)[1]


def test_hgx_full_passthrough_binds_the_nvswitches_and_delete_gives_them_back(tmp_path, netns):
    from agent.hw.sysfs_fake import FakeSysfs
    from agent.hw.vfio import VfioBinder

    fake = FakeSysfs(tmp_path / "sys")
    gpus = tuple(f"0000:{0x10 + i:02x}:00.0" for i in range(8))
    for i, bdf in enumerate(gpus):
        fake.add_gpu(bdf, group=i, device_id="0x2335", numa_node=0)
    switches = [f"0000:{0x05 + i:02x}:00.0" for i in range(4)]
    for i, bdf in enumerate(switches):
        fake.add_nvswitch(bdf, group=40 + i)
    binder = VfioBinder(fake.root, kernel=fake.kernel, daemons=fake.daemons, proc_root=fake.proc,
                        vfio_ids=frozenset(), hold_wait_s=0.2, poll_s=0.05)
    golden = tmp_path / "golden.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(golden), "1G"], check=True)
    (tmp_path / "models/meta-llama/Llama-3.1-8B").mkdir(parents=True)
    driver = LibvirtDriver("test:///default", image=golden, state_dir=tmp_path / "vms", models_dir=tmp_path / "models",
                           network=BridgeNetwork("fabric0", netns=netns), sysfs_root=fake.root, binder=binder)
    with pytest.raises(InvalidInput, match="1 GPU or all 8"):
        driver.create(spec("hgx-half", gpus=gpus[:4]))
    assert all(fake.driver_of(s) == "nvidia-nvswitch" for s in switches)
    try:
        driver.create(spec("hgx-full", gpus=gpus))
        assert all(fake.driver_of(s) == "vfio-pci" for s in switches)
        stored = ET.fromstring(libvirt.open("test:///default").lookupByName("fabric-hgx-full").XMLDesc(0))
        assert len(stored.findall("devices/hostdev")) == 12
    finally:
        driver.delete("hgx-full")
    assert all(fake.driver_of(s) == "nvidia-nvswitch" for s in switches)


def test_seed_sets_up_dsr_ipip_only_when_asked(tmp_path):
    import yaml

    plain = VmSpec(replica_id="lv-g", deployment="d", model_name="m", model_source=f"file://{tmp_path}/org/m")
    config = yaml.safe_load(build_seed(plain, hostname="fabric-lv-g", models_dir=tmp_path)[1])
    assert not any("dsr" in f["path"] for f in config["write_files"])
    dsr = VmSpec(replica_id="lv-g", deployment="d", model_name="m", model_source=f"file://{tmp_path}/org/m",
                 dsr_vips=("10.96.0.7",))
    config = yaml.safe_load(build_seed(dsr, hostname="fabric-lv-g", models_dir=tmp_path)[1])
    files = {f["path"]: f["content"] for f in config["write_files"]}
    unit = files["/etc/systemd/system/fabric-dsr.service"]
    assert "ExecStart=/sbin/ip link set tunl0 up" in unit
    assert "ExecStart=/sbin/ip addr replace 10.96.0.7/32 dev lo" in unit
    assert files["/etc/modules-load.d/fabric-dsr.conf"] == "ipip\n"
    assert "net.ipv4.conf.all.arp_ignore = 1" in files["/etc/sysctl.d/60-fabric-dsr.conf"]
    assert ["systemctl", "enable", "--now", "fabric-dsr.service"] in config["runcmd"]
    # nothing but an address reaches the unit's command lines
    bad = VmSpec(replica_id="lv-g", deployment="d", model_name="m", model_source=f"file://{tmp_path}/org/m",
                 dsr_vips=("10.96.0.7 dev eth0; reboot",))
    with pytest.raises(ValueError):
        build_seed(bad, hostname="fabric-lv-g", models_dir=tmp_path)


def test_a_replica_with_adapters_gets_their_share_and_lora_flags(host, tmp_path):
    """The model's LoRA adapter set is a second read-only virtiofs share (tag "adapters") in the
    domain libvirt stores, and the seed mounts it at /adapters and starts vLLM with LoRA on."""
    from lab.tiny_model import write_tiny_adapter

    driver, _golden, _network = host
    adapters = tmp_path / "set"
    write_tiny_adapter(adapters / "sql", rank=16)
    s = dataclasses.replace(spec("lv-d"), adapters_dir=str(adapters), max_loras=4, max_lora_rank=16)
    driver.define(s)
    stored = ET.fromstring(libvirt.open("test:///default").lookupByName("fabric-lv-d").XMLDesc(0))
    shares = {fs.find("target").get("dir"): fs for fs in stored.findall("devices/filesystem")}
    assert set(shares) == {"models", "adapters"}
    assert shares["adapters"].find("driver").get("type") == "virtiofs"
    ro_ok, _why = driver.readonly_mode()
    if ro_ok:
        assert shares["adapters"].find("readonly") is not None
        assert shares["adapters"].find("source").get("dir") == str(adapters)
    else:  # a read-only bind mount of the set is what virtiofsd exports
        bind = driver.adapters_share_dir("lv-d")
        assert shares["adapters"].find("source").get("dir") == str(bind)
        assert (bind / "sql" / "adapter_config.json").is_file()
        with pytest.raises(OSError):
            (bind / "written-by-guest").write_text("x")
    user = iso_file(driver.paths("lv-d").seed, "user-data")
    assert "--enable-lora --max-loras 4 --max-lora-rank 16" in user and "mount /adapters" in user
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True" in user
    driver.delete("lv-d")
    assert not driver.adapters_share_dir("lv-d").exists()
