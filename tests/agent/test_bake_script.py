"""scripts/bake-ai-vllm-image.sh: syntax, shellcheck, usage errors, the dry run, and a real
run with qemu-img and a stand-in virt-customize (a logging script on PATH; libguestfs is
not installed here)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts/bake-ai-vllm-image.sh"
GUEST_SCRIPT = REPO / "images/guest/install-guest.sh"


def bake(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env or os.environ.copy(),
        check=False,
    )


def test_bash_syntax():
    for script in (SCRIPT, GUEST_SCRIPT):
        assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0


def test_shellcheck_clean():
    done = subprocess.run(
        ["shellcheck", str(SCRIPT), str(GUEST_SCRIPT)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout


@pytest.mark.parametrize("args", [(), ("only-one.qcow2",), ("a", "b", "c"), ("--bogus", "a", "b")])
def test_usage_errors(args):
    done = bake(*args)
    assert done.returncode == 2
    assert "usage:" in done.stderr


def test_dry_run_prints_every_step_and_runs_none(tmp_path):
    src = tmp_path / "ubuntu.qcow2"
    src.write_bytes(b"not really an image")
    dst = tmp_path / "out/golden.qcow2"
    env = dict(os.environ, PATH="/usr/bin:/bin", HF_TOKEN="hf_shouldneverappear42")
    done = bake("--dry-run", "--vllm", "0.31.0", str(src), str(dst), env=env)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    steps = [line for line in out.splitlines() if line.startswith("==> step")]
    assert len(steps) == 6
    for fragment in (
        "qemu-img convert -q -O qcow2",
        "FABRIC_ROOT_PARTITION=/dev/sda1",
        "virt-customize -a",
        "install-guest.sh",
        "FABRIC_RUNTIME=vllm FABRIC_RUNTIME_VERSION=0.31.0",
        "engine.service.in",
        "/etc/cloud/cloud.cfg.d/99-fabric.cfg",
        "--truncate /etc/machine-id",
        f"sha256sum golden.qcow2 > {dst}.sha256",
    ):
        assert fragment in out.replace("\\ ", " "), fragment
    assert "hf_shouldneverappear42" not in out
    assert not dst.exists() and not Path(f"{dst}.sha256").exists()
    assert not list(tmp_path.glob("**/*.partial"))


def test_refuses_to_overwrite_without_force(tmp_path):
    src = tmp_path / "src.qcow2"
    src.write_bytes(b"x")
    dst = tmp_path / "dst.qcow2"
    dst.write_bytes(b"precious")
    done = bake("--dry-run", str(src), str(dst))
    assert done.returncode == 1 and "--force" in done.stderr
    assert bake("--dry-run", "--force", str(src), str(dst)).returncode == 0
    assert dst.read_bytes() == b"precious"


def test_missing_source_and_same_file(tmp_path):
    done = bake("--dry-run", str(tmp_path / "nope.qcow2"), str(tmp_path / "d.qcow2"))
    assert done.returncode == 1 and "does not exist" in done.stderr
    src = tmp_path / "s.qcow2"
    src.write_bytes(b"x")
    assert "same file" in bake("--dry-run", "--force", str(src), str(src)).stderr


def test_real_run_without_virt_customize_says_how_to_install(tmp_path):
    src = tmp_path / "s.qcow2"
    src.write_bytes(b"x")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    # A PATH of exactly the tools the script needs before it looks for virt-customize, so the
    # test runs the same whether or not this machine has libguestfs.
    for tool in ("bash", "dirname", "realpath", "qemu-img"):
        (bindir / tool).symlink_to(shutil.which(tool))
    env = dict(os.environ, PATH=str(bindir))
    done = bake(str(src), str(tmp_path / "d.qcow2"), env=env)
    assert done.returncode == 1 and "libguestfs-tools" in done.stderr


def test_real_run_with_stand_in_virt_customize(tmp_path):
    src = tmp_path / "ubuntu.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(src), "64M"], check=True)
    src_hash = hashlib.sha256(src.read_bytes()).hexdigest()
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "virt-customize.log"
    for tool in ("virt-customize", "virt-resize"):
        fake = bindir / tool
        fake.write_text(f'#!/bin/sh\necho "{tool} $@" >> {log}\n')
        fake.chmod(0o755)
    dst = tmp_path / "golden.qcow2"
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}")
    done = bake("--size", "128M", str(src), str(dst), env=env)
    assert done.returncode == 0, done.stderr
    assert hashlib.sha256(src.read_bytes()).hexdigest() == src_hash  # source only read
    digest = hashlib.sha256(dst.read_bytes()).hexdigest()
    assert Path(f"{dst}.sha256").read_text() == f"{digest}  golden.qcow2\n"
    assert (
        subprocess.run(
            ["sha256sum", "-c", "golden.qcow2.sha256"], cwd=tmp_path, capture_output=True, check=False
        ).returncode
        == 0
    )
    lines = log.read_text().splitlines()
    assert [line.split()[0] for line in lines] == ["virt-customize"] * 3
    assert "FABRIC_ROOT_PARTITION=/dev/sda1" in lines[0] and "--memsize 8192" in lines[0]
    assert "FABRIC_NVIDIA_VERSION=580.82.07" in lines[0] and "FABRIC_RUNTIME_VERSION=0.32.0" in lines[0]
    assert "engine-args.json:/tmp/engine-args.json" in lines[0] and "check-vllm-args.py" in lines[0]
    info = json.loads(subprocess.run(["qemu-img", "info", "--output=json", str(dst)], capture_output=True,
                                     text=True, check=True).stdout)
    assert info["format"] == "qcow2" and info["virtual-size"] == 128 << 20  # SRC's 64M copied and grown
    assert not Path(f"{dst}.partial").exists()


@pytest.mark.parametrize("runtime,fragment", [
    ("vllm", "FABRIC_RUNTIME=vllm FABRIC_RUNTIME_VERSION=latest"),
    ("tensorrt-llm", "/opt/trtllm"),
    ("llama.cpp", "FABRIC_RUNTIME=llama.cpp FABRIC_RUNTIME_VERSION=b4500"),
])
def test_dry_run_per_runtime(tmp_path, runtime, fragment):
    src = tmp_path / "u.qcow2"
    src.write_bytes(b"x")
    done = bake("--dry-run", "--runtime", runtime, "--runtime-version", "b4500" if runtime == "llama.cpp" else "latest",
                str(src), str(tmp_path / "g.qcow2"))
    assert done.returncode == 0, done.stderr
    assert fragment in done.stdout.replace("\\ ", " ")
    assert "--copy-in" not in done.stdout


@pytest.mark.parametrize("runtime,binary", [("triton", "bin/tritonserver"), ("tei", "bin/text-embeddings-router")])
def test_prebuilt_runtimes_need_and_upload_a_runtime_dir(tmp_path, runtime, binary):
    src = tmp_path / "u.qcow2"
    src.write_bytes(b"x")
    dst = str(tmp_path / "g.qcow2")
    missing = bake("--dry-run", "--runtime", runtime, str(src), dst)
    assert missing.returncode == 1 and "--runtime-dir" in missing.stderr
    tree = tmp_path / "tree"
    assert bake("--dry-run", "--runtime", runtime, "--runtime-dir", str(tree), str(src), dst).returncode == 1
    (tree / binary).parent.mkdir(parents=True)
    (tree / binary).write_text("#!/bin/sh\n")
    done = bake("--dry-run", "--runtime", runtime, "--runtime-dir", str(tree), str(src), dst)
    assert done.returncode == 0, done.stderr
    opt = {"triton": "/opt/tritonserver", "tei": "/opt/tei"}[runtime]
    assert f"--copy-in {tree}/.:{opt}" in done.stdout
    assert len([line for line in done.stdout.splitlines() if line.startswith("==> step")]) == 7


@pytest.mark.parametrize("args,message", [
    (("--runtime", "tgi"), "unknown runtime tgi"),
    (("--runtime", "vllm", "--runtime-version", "1.0;reboot"), "--runtime-version"),
    (("--runtime", "vllm", "--runtime-dir", "/tmp"), "triton and tei only"),
])
def test_runtime_flags_are_checked(tmp_path, args, message):
    src = tmp_path / "u.qcow2"
    src.write_bytes(b"x")
    done = bake("--dry-run", *args, str(src), str(tmp_path / "g.qcow2"))
    assert done.returncode != 0 and message in done.stderr


def test_versions_have_one_home_and_flags_override_them(tmp_path):
    versions = dict(line.split("#")[0].strip().split("=", 1) for line in
                    (REPO / "images/guest/versions.env").read_text().splitlines()
                    if "=" in line and not line.startswith("#"))
    src = tmp_path / "u.qcow2"
    src.write_bytes(b"x")
    out = bake("--dry-run", str(src), str(tmp_path / "g.qcow2")).stdout.replace("\\ ", " ")
    assert f"FABRIC_NVIDIA_VERSION={versions['FABRIC_NVIDIA_VERSION']}" in out
    assert f"FABRIC_RUNTIME_VERSION={versions['FABRIC_VLLM_VERSION']}" in out
    assert f"FABRIC_CUDA={versions['FABRIC_CUDA']}" in out
    assert "FABRIC_NVIDIA_OPEN=0 FABRIC_FABRIC_MANAGER=0" in out
    out = bake("--dry-run", "--nvidia-driver", "560.35.03", "--open-kernel-modules", "--fabric-manager",
               "--vllm", "0.7.0", str(src), str(tmp_path / "g.qcow2")).stdout.replace("\\ ", " ")
    assert "FABRIC_NVIDIA_VERSION=560.35.03" in out and "FABRIC_RUNTIME_VERSION=0.7.0" in out
    assert "FABRIC_NVIDIA_OPEN=1 FABRIC_FABRIC_MANAGER=1" in out and "fabric manager" in out
    branch_only = bake("--dry-run", "--nvidia-driver", "550", str(src), str(tmp_path / "g.qcow2"))
    assert branch_only.returncode == 1 and "exact version" in branch_only.stderr


def test_guest_script_pins_holds_and_imports():
    text = GUEST_SCRIPT.read_text()
    assert "apt-cache madison" in text and "apt-mark hold" in text  # exact versions, kernel held
    assert "nvidia-fabricmanager-${BRANCH}" in text and "libnvidia-nscq-${BRANCH}" in text
    assert "server-open" in text and "linux-headers-${k}" in text
    assert 'import vllm, torch' in text and "vllm serve --help" not in text
    assert "df --output=avail" in text  # refuses to install into a root that was not grown


def test_trtllm_is_pinned_and_needs_a_driver_its_cuda_runs_on(tmp_path):
    src = tmp_path / "u.qcow2"
    src.write_bytes(b"x")
    old_driver = bake("--dry-run", "--runtime", "tensorrt-llm", "--nvidia-driver", "550.127.08", str(src),
                      str(tmp_path / "g.qcow2"))
    assert old_driver.returncode == 1 and "built with CUDA 13" in old_driver.stderr
    assert "branch 580 or newer" in old_driver.stderr
    done = bake("--dry-run", "--runtime", "tensorrt-llm", str(src), str(tmp_path / "g.qcow2"))
    out = done.stdout.replace("\\ ", " ")
    assert done.returncode == 0, done.stderr  # no flag: versions.env's one driver pin runs its CUDA
    assert "FABRIC_NVIDIA_VERSION=580.82.07" in out and "FABRIC_RUNTIME_VERSION=1.3.0rc29" in out


def test_llama_cpp_bake_gets_a_bigger_appliance(tmp_path):
    src = tmp_path / "u.qcow2"
    src.write_bytes(b"x")
    out = bake("--dry-run", "--runtime", "llama.cpp", str(src), str(tmp_path / "g.qcow2")).stdout
    assert "--memsize 16384" in out
    assert bake("--dry-run", "--appliance-memory", "lots", str(src), str(tmp_path / "g.qcow2")).returncode == 1


@pytest.mark.parametrize("args, archs", [
    ((), "'80;86;89;90'"),  # sm_80 A100, sm_86 A10/A40, sm_89 L4/L40S, sm_90 H100/H200
    (("--cuda-archs", "89"), "'89'"),
    (("--cuda-archs", "80,90"), "'80;90'"),
])
def test_llama_cpp_is_built_for_the_gpus_fabric_places_or_the_flag(tmp_path, args, archs):
    src = tmp_path / "u.qcow2"
    src.write_bytes(b"x")
    done = bake("--dry-run", "--runtime", "llama.cpp", *args, str(src), str(tmp_path / "g.qcow2"))
    assert done.returncode == 0, done.stderr
    assert f"FABRIC_CUDA_ARCHS={archs}" in done.stdout.replace("\\ ", " ").replace("\\;", ";").replace("\\'", "'")


@pytest.mark.parametrize("archs", ["native", "80;;90", "80 90", "90;$(reboot)"])
def test_a_cuda_arch_list_that_is_not_numbers_is_refused(tmp_path, archs):
    src = tmp_path / "u.qcow2"
    src.write_bytes(b"x")
    done = bake("--dry-run", "--cuda-archs", archs, str(src), str(tmp_path / "g.qcow2"))
    assert done.returncode == 1 and "--cuda-archs" in done.stderr


def test_cloud_init_reads_our_config_after_ubuntus():
    """cloud-init reads cloud.cfg.d/*.cfg sorted, later files win: ours must sort after 90_dpkg.cfg."""
    ours = [p.name for p in (REPO / "images/cloud-init").glob("*.cfg")]
    ubuntu = ["05_logging.cfg", "90_dpkg.cfg", "90-installer-network.cfg", "99-installer.cfg"]
    order = sorted(ours + ubuntu)
    assert order.index(ours[0]) > order.index("90_dpkg.cfg") and ours == ["99-fabric.cfg"]
    assert sorted(["90-fabric.cfg", "90_dpkg.cfg"])[-1] == "90_dpkg.cfg"  # the old name lost to Ubuntu's
