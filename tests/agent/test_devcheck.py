"""scripts/devcheck-gpu-host (agent/hw/devcheck.py): the read-only GPU host check. Here it runs
against the fake sysfs and fake NVML the agent's own tests use (and a stand-in nvidia-smi that
prints what the real one would), and for real on this GPU-less machine; a static scan proves it
holds no mutating nvidia-smi flag and no write outside its output directory."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent.hw.devcheck import Devcheck, DevcheckConfig
from agent.hw.gpu_holders import device_nodes
from agent.hw.nvml_fake import FakeNvml, make_gpus
from agent.hw.pci_sysfs import normalise_pci
from agent.hw.sysfs_fake import FakeSysfs

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "devcheck-gpu-host"
MODULE = ROOT / "agent" / "hw" / "devcheck.py"
FAKE_SMI = """#!/bin/sh
case "$*" in
  --query-gpu=pci.bus_id,temperature.gpu,power.draw,ecc.errors.uncorrected.aggregate.total*)
    echo "00000000:3B:00.0, 41, 71.50, 0"; echo "00000000:3C:00.0, 43, 70.10, [N/A]" ;;
  "-q -x") echo '<?xml version="1.0" ?><nvidia_smi_log><attached_gpus>2</attached_gpus></nvidia_smi_log>' ;;
  "topo -m") printf '\\tGPU0\\tGPU1\\nGPU0\\t X \\tNV18\\nGPU1\\tNV18\\t X \\n' ;;
  *) echo "devcheck ran a command it must not: $*" >&2; exit 9 ;;
esac
"""


def _tree(root: Path) -> dict[str, str]:
    """Every file's content and every link's target under root: what a write would change."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = "-> " + os.readlink(p)
            elif p.is_file():
                out[rel] = p.read_text(errors="replace")
    return out


@pytest.fixture
def host(tmp_path):
    fake = FakeSysfs(tmp_path / "sys")
    nvml = FakeNvml(gpus=make_gpus(2, "h100"))
    for i, gpu in enumerate(nvml.gpus):
        fake.add_gpu(normalise_pci(gpu.bus_id), group=40 + i, audio=True)
    fake.add_nvswitch("0000:05:00.0", group=50)
    # A process holding the second GPU's /dev/nvidiaN open, as /proc shows it to the holder scan.
    minor = [n for n in device_nodes(fake.root, fake.proc, "0000:3c:00.0") if n.startswith("/dev/nvidia")]
    (fake.proc / "777" / "fd").mkdir(parents=True)
    (fake.proc / "777" / "comm").write_text("python3\n")
    (fake.proc / "777" / "fd" / "3").symlink_to(minor[0])
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text(FAKE_SMI)
    smi.chmod(0o755)
    return fake, nvml, smi


def test_checks_a_fake_host_and_changes_nothing_there(host, tmp_path):
    fake, nvml, smi = host
    before = _tree(fake.root), _tree(fake.proc)
    out = tmp_path / "out"
    summary = Devcheck(DevcheckConfig(out=out, sysfs_root=fake.root, proc_root=fake.proc, nvidia_smi=str(smi),
                                      nvml=nvml, libcuda="libcuda-absent.so.1")).run()
    status = {c["name"]: c["status"] for c in summary["checks"]}
    assert status == {"smi-query": "ok", "smi-xml": "ok", "smi-topo": "ok", "nvml": "ok", "sysfs": "ok",
                      "holders": "ok", "vfio-plan": "ok", "cuda": "absent"}, summary
    assert summary["verdict"] == "ok" and summary["gpus"] == 2
    assert (_tree(fake.root), _tree(fake.proc)) == before  # read-only: not one write under /sys or /proc
    parsed = json.loads((out / "smi_query.parsed.json").read_text())
    assert parsed["0000:3b:00.0"]["temperature_c"] == 41 and parsed["0000:3c:00.0"]["ecc_uncorrected"] is None
    assert "NV18" in (out / "smi_topo.stdout").read_text() and "<nvidia_smi_log>" in (out / "smi_xml.stdout").read_text()
    plans = json.loads((out / "vfio_plans.json").read_text())
    bind = plans["0000:3b:00.0"]["bind"]
    assert bind["refusal"] is None and sorted(bind["functions"]) == ["0000:3b:00.0", "0000:3b:00.1"]
    assert {w["path"] for s in bind["steps"] for w in s["writes"]} >= {"bus/pci/drivers_probe"}  # planned only
    holders = json.loads((out / "holders.json").read_text())
    assert holders["0000:3c:00.0"]["holders"] == ["pid 777 (python3)"] and holders["0000:3b:00.0"]["holders"] == []
    inventory = json.loads((out / "host_inventory.json").read_text())
    assert [g["pci"] for g in inventory["gpus"]] == ["0000:3b:00.0", "0000:3c:00.0"]
    assert inventory["nvswitches"] == ["0000:05:00.0"]
    raw = json.loads((out / "sysfs" / "0000:3b:00.0.json").read_text())
    assert raw["driver->"] == "nvidia" and raw["iommu_group->"] == "40" and raw["vendor"] == "0x10de"
    assert json.loads((out / "summary.json").read_text()) == summary


def test_the_script_on_this_gpu_less_machine_says_no_gpu(tmp_path):
    if Path("/dev/nvidiactl").exists():
        pytest.skip("this machine has an NVIDIA driver: the no-GPU answer is not what it should say")
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "o")], capture_output=True,
                          text=True, timeout=120, env=env, check=False)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["verdict"] == "no GPU" and summary["gpus"] == 0
    assert {c["status"] for c in summary["checks"]} == {"absent"}
    assert json.loads((tmp_path / "o" / "summary.json").read_text()) == summary


MUTATING = {"-pm", "--persistence-mode", "-mig", "--multi-instance-gpu", "-e", "--ecc-config", "-r", "--gpu-reset",
            "-pl", "--power-limit", "-lgc", "-rgc", "-lmc", "-rmc", "-ac", "-rac", "-c", "--compute-mode",
            "-am", "-caa", "modprobe", "insmod", "rmmod", "setpci", "reset", "remove", "rescan"}


def _strings(path: Path) -> set[str]:
    return {n.value for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Constant)
            and isinstance(n.value, str)}


def test_no_mutating_flag_and_no_write_outside_the_output_directory():
    for path in (SCRIPT, MODULE):
        words = {w for s in _strings(path) for w in s.split()}
        assert not words & MUTATING, f"{path.name}: {sorted(words & MUTATING)}"
        text = path.read_text()
        for name in ("LinuxKernelIO", "NvidiaSmiDaemons", "set_persistence", ".bind(", ".release(", "/sys/bus/pci"):
            assert name not in text, f"{path.name} mentions {name}"
    tree = ast.parse(MODULE.read_text())
    writers = {"write_text", "write_bytes", "open", "write", "mkdir", "unlink", "rename", "symlink_to", "touch",
               "chmod", "rmdir", "rmtree"}
    for fn in [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]:
        for call in [n for n in ast.walk(fn) if isinstance(n, ast.Call)]:
            name = getattr(call.func, "attr", getattr(call.func, "id", ""))
            if name in writers:
                # Only the fixture writer (under cfg.out), its constructor's mkdir, and the KernelIO
                # whose write refuses may touch the filesystem.
                assert fn.name in ("_write", "__init__"), f"{fn.name} calls {name}"
