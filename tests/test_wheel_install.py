"""The wheel works when installed: built from the checkout's files (offline, no build isolation),
installed into a clean venv, and the XDP dataplane compiled and loaded from the installed copy.

The BPF C sources and the guest seed pieces are package data (dataplane/bpf and
agent/vm/images link to dataplane/bpf and images/ in a checkout), found with importlib.resources.
The clean venv sees Debian's BCC (--system-site-packages) and the project's dependencies from the
repo venv's site-packages as a plain path (its .pth files, the editable install's finder among
them, are not processed), so `agent` can only come from the installed wheel.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from lab.rigs.bpf import bpf_missing, new_pin_dir
from lab.rigs.checkout import checkout_copy

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(bpf_missing() is not None, reason=bpf_missing() or "")

CHECK = r"""
import json, shutil, sys
from agent.dataplane import Dataplane
from agent.dataplane import loader, verdicts
from agent.vm import cloud_init
from agent.vm.base import VmSpec

pin_dir = sys.argv[1]
plane = Dataplane(pin_dir=pin_dir, flow_entries=1024)
try:
    plane.put_service("10.99.0.1", 8000, "tcp", {"10.1.0.11:8000": 1, "10.1.0.12:8000": 1})
    service = plane.get_service("10.99.0.1", 8000, "tcp")
    meta, user = cloud_init.build_seed(
        VmSpec(replica_id="w1", deployment="d", model_name="m", model_source="hf://o/m"), hostname="fabric-w1")
    print(json.dumps({
        "agent": __import__("agent").__file__, "bpf_dir": str(loader.BPF_DIR),
        "verdicts_h": str(verdicts.VERDICTS_HEADER), "images": str(cloud_init.images_dir()),
        "backends": sorted(b.address for b in service.backends), "seed_has_engine": "fabric-engine" in user,
    }))
finally:
    plane.close()
    shutil.rmtree(pin_dir, ignore_errors=True)
"""


def test_wheel_installs_and_loads_the_dataplane_from_the_installed_copy(tmp_path):
    src = tmp_path / "src"
    checkout_copy(src)
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    "-w", str(wheels), str(src)], check=True, capture_output=True, timeout=180)
    (wheel,) = wheels.glob("fabric-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys._base_executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
                   check=True, timeout=60)
    python = venv / "bin/python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                    "--no-index", str(wheel)], check=True, capture_output=True, timeout=120)
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "fabric-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    shutil.rmtree(src)  # nothing may be read from the copy the wheel was built from
    pin_dir = new_pin_dir()
    done = subprocess.run([str(python), "-P", "-c", CHECK, pin_dir], cwd=tmp_path, capture_output=True, text=True,
                          timeout=240)
    shutil.rmtree(pin_dir, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    for key in ("agent", "bpf_dir", "verdicts_h", "images"):
        path = Path(out[key])
        assert path.is_relative_to(site), (key, path)
        assert not path.resolve().is_relative_to(REPO), (key, path)  # real files, no link into the repo
    assert (Path(out["bpf_dir"]) / "maglev.c").is_file() and not Path(out["bpf_dir"]).is_symlink()
    assert out["backends"] == ["10.1.0.11:8000", "10.1.0.12:8000"]
    assert out["seed_has_engine"]
