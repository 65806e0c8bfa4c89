"""images/guest/install-guest.sh's pieces, run by bash: the root grown with the real growpart and
resize2fs on a loop device laid out like Ubuntu's cloud image (BIOS boot 14, ESP 15, root 1),
the CUDA package chosen per Ubuntu release, llama.cpp's build flags and its --version check, and
each runtime's option check against its --help, with stand-ins only for what needs NVIDIA's repositories."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from common.runtimes import runtime as runtime_table

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "images/guest/install-guest.sh"


def run_fn(body: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Source the script (main does not run) and run `body` in the same bash."""
    return subprocess.run(["bash", "-c", f"set -euo pipefail\nsource {SCRIPT}\n{body}"], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **(env or {})}, cwd=cwd)


# -- root growth ----------------------------------------------------------------------------------

needs_disk_tools = pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(t) for t in ("growpart", "sgdisk", "losetup", "resize2fs")),
    reason="needs root, growpart (cloud-guest-utils), sgdisk (gdisk) and losetup")


def _partitions(image: Path) -> dict[int, tuple[int, int]]:
    table = json.loads(subprocess.run(["sfdisk", "--json", str(image)], capture_output=True, text=True,
                                      check=True).stdout)["partitiontable"]["partitions"]
    return {int(p["node"].rsplit("img", 1)[1]): (p["start"], p["size"]) for p in table}


def _loop(image: Path, start: int, sectors: int) -> str:
    """A loop device over one partition of the image (this kernel makes no partition nodes)."""
    return subprocess.run(["losetup", "--find", "--show", "--offset", str(start * 512), "--sizelimit",
                           str(sectors * 512), str(image)], capture_output=True, text=True, check=True).stdout.strip()


def _fs_bytes(device: str) -> int:
    head = subprocess.run(["dumpe2fs", "-h", device], capture_output=True, text=True, check=True).stdout
    fields = dict(line.split(":", 1) for line in head.splitlines() if ":" in line)
    return int(fields["Block count"]) * int(fields["Block size"])


@needs_disk_tools
def test_root_grows_in_place_and_keeps_the_partition_numbers(tmp_path):
    image = tmp_path / "disk.img"
    subprocess.run(["truncate", "-s", "256M", str(image)], check=True)
    # Ubuntu's cloud image layout: BIOS boot (14) and ESP (15) first, root (1) after them.
    subprocess.run(["sgdisk", "-n", "14:2048:+4M", "-t", "14:EF02", "-n", "15:0:+32M", "-t", "15:EF00",
                    "-n", "1:0:0", "-t", "1:8300", str(image)], check=True, capture_output=True)
    before = _partitions(image)
    loop = _loop(image, *before[1])
    try:
        subprocess.run(["mkfs.ext4", "-q", "-F", loop], check=True)
        small = _fs_bytes(loop)
    finally:
        subprocess.run(["losetup", "-d", loop], check=True)
    subprocess.run(["truncate", "-s", "512M", str(image)], check=True)  # qemu-img resize's part
    # grow_root = grow_partition on the disk + resize2fs on the partition: here the disk is the
    # image file and the partition a loop device over its new extent.
    done = run_fn(f"grow_partition {image} 1")
    assert done.returncode == 0, done.stderr + done.stdout
    after = _partitions(image)
    loop = _loop(image, *after[1])
    try:
        grown = run_fn(f"resize2fs {loop}")
        assert grown.returncode == 0, grown.stderr
        fsck = subprocess.run(["e2fsck", "-fn", loop], capture_output=True, text=True)
        assert fsck.returncode == 0, fsck.stdout
        big = _fs_bytes(loop)
    finally:
        subprocess.run(["losetup", "-d", loop], check=True)
    again = run_fn(f"grow_partition {image} 1")  # nothing left to grow: growpart's NOCHANGE is fine
    assert again.returncode == 0, again.stderr
    assert sorted(after) == sorted(before) == [1, 14, 15]  # nothing renumbered
    assert after[14] == before[14] and after[15] == before[15] and after[1][0] == before[1][0]
    assert after[1][1] > before[1][1] + (200 << 20) // 512  # root now spans the added 256 MiB
    assert big > small + (200 << 20)  # and so does its filesystem
    verify = subprocess.run(["sgdisk", "-v", str(image)], capture_output=True, text=True)
    assert "No problems found" in verify.stdout, verify.stdout  # backup GPT moved to the new end


def test_grow_root_refuses_a_missing_disk():
    done = run_fn("grow_root /dev/nonexistent1")
    assert done.returncode != 0 and "no disk /dev/nonexistent" in done.stderr


# -- CUDA per Ubuntu release ------------------------------------------------------------------------------

APT_CACHE_STUB = """apt-cache() {  # the CUDA repository as NVIDIA publishes it: 12-4 not for noble
  [ "$1" = show ] || return 1
  case "$(. "$OS"; echo "$VERSION_ID"):$2" in
    22.04:cuda-toolkit-12-4|22.04:cuda-toolkit-13-0|24.04:cuda-toolkit-12-6|24.04:cuda-toolkit-13-0) return 0 ;;
  esac
  return 100
}
"""


@pytest.mark.parametrize("release,cuda,expected", [
    ("22.04", "auto", "cuda-toolkit-13-0"),  # the CUDA 13 of vLLM's and TensorRT-LLM's wheels
    ("24.04", "auto", "cuda-toolkit-13-0"),
    ("24.04", "12-4", None),
    ("20.04", "auto", None),
])
def test_cuda_toolkit_is_chosen_per_release_and_must_exist(tmp_path, release, cuda, expected):
    os_release = tmp_path / "os-release"
    os_release.write_text(f'NAME="Ubuntu"\nVERSION_ID="{release}"\n')
    versions = dict(line.split("#")[0].strip().split("=", 1) for line in
                    (REPO / "images/guest/versions.env").read_text().splitlines()
                    if line.startswith("FABRIC_CUDA_UBUNTU"))
    done = run_fn(APT_CACHE_STUB + f"cuda_package {os_release}",
                  env={"OS": str(os_release), "FABRIC_CUDA": cuda, **versions})
    if expected:
        assert done.returncode == 0 and done.stdout.strip() == expected, done.stderr
    else:
        assert done.returncode != 0 and ("not published for Ubuntu 24.04" in done.stderr
                                         or "no CUDA version for Ubuntu 20.04" in done.stderr), done.stderr


# -- llama.cpp ---------------------------------------------------------------------------------------

def _llama_stubs(tmp_path: Path, ldd_output: str) -> Path:
    bin_dir = tmp_path / "stubs"
    bin_dir.mkdir()
    (bin_dir / "cmake").write_text(f"""#!/bin/bash
printf '%s\\n' "$*" >> {tmp_path}/cmake.log
if [ "$1" = --build ]; then
  mkdir -p "$2/bin"
  printf '#!/bin/sh\\n[ "$1" = --version ] && echo "version: 4500 (stub)" && touch {tmp_path}/ran-version\\n' > "$2/bin/llama-server"
  chmod +x "$2/bin/llama-server"
fi
""")
    (bin_dir / "ldd").write_text(f"#!/bin/sh\nprintf '%s\\n' '{ldd_output}'\n")
    (bin_dir / "nproc").write_text("#!/bin/sh\necho 4\n")
    for stub in bin_dir.iterdir():
        stub.chmod(0o755)
    return bin_dir


def test_llama_cpp_builds_static_for_the_given_archs_and_runs_version(tmp_path):
    stubs = _llama_stubs(tmp_path, "\tlibcudart.so.12 => /usr/local/cuda/lib64/libcudart.so.12")
    (tmp_path / "src").mkdir()
    done = run_fn(f"install_llama_cpp {tmp_path}/src {tmp_path}/opt",
                  env={"PATH": f"{stubs}:{os.environ['PATH']}", "FABRIC_CUDA_ARCHS": "90"})
    assert done.returncode == 0, done.stderr
    configure = (tmp_path / "cmake.log").read_text().splitlines()[0].split()
    for flag in ("-DGGML_CUDA=ON", "-DBUILD_SHARED_LIBS=OFF", "-DGGML_NATIVE=OFF", "-DCMAKE_CUDA_ARCHITECTURES=90"):
        assert flag in configure, configure
    assert (tmp_path / "opt/bin/llama-server").is_file() and (tmp_path / "ran-version").exists()
    assert "version: 4500" in done.stdout


def test_llama_cpp_that_needs_the_deleted_build_tree_fails_the_bake(tmp_path):
    stubs = _llama_stubs(tmp_path, "\tlibllama.so => not found")
    (tmp_path / "src").mkdir()
    done = run_fn(f"install_llama_cpp {tmp_path}/src {tmp_path}/opt", env={"PATH": f"{stubs}:{os.environ['PATH']}"})
    assert done.returncode != 0 and "links libraries the bake does not keep" in done.stderr


# -- every runtime's options against the installed engine's --help ----------------------------------------

HELP = {  # each engine's --help as it lists its options (abridged), with every option Fabric passes
    "tensorrt-llm": "Options:\n  --host TEXT\n  --port INTEGER\n  --tensor_parallel_size, --tp_size INTEGER\n"
                    "  --max_seq_len INTEGER\n  --config, --extra_llm_api_options TEXT\n",
    "llama.cpp": "-m,    --model FNAME\n-a,    --alias STRING\n--host HOST\n--port PORT\n--metrics\n"
                 "-ngl,  --gpu-layers, --n-gpu-layers N\n-c,    --ctx-size N\n",
    "tei": "      --model-id <MODEL_ID>\n      --served-model-name <NAME>\n      --hostname <HOSTNAME>\n"
           "  -p, --port <PORT>\n      --prometheus-port <PORT>\n",
}


@pytest.mark.parametrize("runtime", sorted(HELP))
def test_every_option_fabric_passes_must_be_in_the_installed_engines_help(runtime):
    checks = {"FABRIC_RUNTIME": runtime, "FABRIC_ENGINE_CHECKS": str(REPO / "images/guest/engine-args.json")}
    ok = run_fn(f"check_options {runtime} {shlex.quote(HELP[runtime])}", env=checks)
    assert ok.returncode == 0, ok.stderr
    first = runtime_table(runtime).flags()[0]
    without = "\n".join(line for line in HELP[runtime].splitlines() if first not in line.replace(",", " ").split())
    missing = run_fn(f"check_options 'the engine 1.2' {shlex.quote(without)}", env=checks)
    assert missing.returncode != 0, without
    assert f"the engine 1.2 has no {first} (Fabric's guest unit passes it)" in missing.stderr
