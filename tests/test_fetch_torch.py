"""scripts/fetch-torch.sh: the pinned +cpu torch comes from the machine's configured pip sources
when they carry it, else from PyTorch's CPU wheel index, and setup-engine.sh installs that wheel.

Real pip, no network: every pip source is a directory this test makes (PIP_CONFIG_FILE=/dev/null
drops the machine's pip.conf), and FABRIC_TORCH_INDEX points the fallback at a local copy of a
PEP 503 index laid out as PyTorch's is. The wheel is a tiny stand-in with torch's exact file name.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "fetch-torch.sh"
PIN = "torch==2.13.0+cpu"
WHEEL = "torch-2.13.0+cpu-py3-none-any.whl"


def make_wheel(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / WHEEL
    info = "torch-2.13.0+cpu.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("torch/__init__.py", "__version__ = '2.13.0+cpu'\n")
        z.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: torch\nVersion: 2.13.0+cpu\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return path


def make_index(root: Path, with_torch: bool) -> str:
    """A PEP 503 'simple' index as a file:// URL (pip reads index.html of a directory)."""
    (root / "torch").mkdir(parents=True)
    links = ""
    if with_torch:
        make_wheel(root / "torch")
        links = f'<a href="{WHEEL.replace("+", "%2B")}">{WHEEL}</a>'
    (root / "torch" / "index.html").write_text(f"<html><body>{links}</body></html>")
    (root / "index.html").write_text('<html><body><a href="torch/">torch</a></body></html>')
    return root.as_uri()


def run(tmp_path: Path, *, configured_has_it: bool, pytorch_has_it: bool) -> subprocess.CompletedProcess:
    links = tmp_path / "find-links"
    links.mkdir()
    if configured_has_it:
        make_wheel(links)
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PIP_CONFIG_FILE": os.devnull,
           "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1", "PIP_RETRIES": "0",
           "PIP_INDEX_URL": make_index(tmp_path / "configured-index", with_torch=False),
           "PIP_FIND_LINKS": str(links),
           "FABRIC_TORCH_INDEX": make_index(tmp_path / "pytorch-cpu", with_torch=pytorch_has_it)}
    dest = tmp_path / "wheels"
    return subprocess.run(["bash", str(SCRIPT), sys.executable, PIN, str(dest)], env=env,
                          capture_output=True, text=True, timeout=120)


def test_a_machine_whose_pip_sources_carry_the_wheel_gets_it_from_them(tmp_path):
    # PyTorch's index is empty here: reaching it would fail the fetch.
    done = run(tmp_path, configured_has_it=True, pytorch_has_it=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "the configured pip sources"
    assert [p.name for p in (tmp_path / "wheels").iterdir()] == [WHEEL]


def test_elsewhere_the_wheel_comes_from_pytorchs_cpu_index(tmp_path):
    done = run(tmp_path, configured_has_it=False, pytorch_has_it=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (tmp_path / "pytorch-cpu").as_uri()
    assert [p.name for p in (tmp_path / "wheels").iterdir()] == [WHEEL]


def test_no_source_with_the_wheel_fails_with_pips_reason(tmp_path):
    done = run(tmp_path, configured_has_it=False, pytorch_has_it=False)
    assert done.returncode != 0
    assert "torch==2.13.0+cpu" in done.stderr and not done.stdout.strip()


def test_the_default_fallback_is_pytorchs_cpu_index_and_setup_engine_installs_what_it_fetched():
    script = SCRIPT.read_text()
    assert "index=${FABRIC_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}" in script
    setup = (REPO / "scripts" / "setup-engine.sh").read_text()
    fetch = setup.index("scripts/fetch-torch.sh")
    assert fetch < setup.index('install -q --no-deps "$wheels"/torch-*.whl') < setup.index('-r "$REQS"')
    reqs = (REPO / "scripts" / "engine-requirements.txt").read_text()
    assert f"\n{PIN}\n" in reqs  # the pin the script is given (grep '^torch==')
