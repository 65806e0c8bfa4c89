"""A read-only bind mount of the model directory, for libvirt/virtiofsd pairs that cannot
export a virtiofs share read-only (libvirt < 11 or virtiofsd < 1.13, agent.vm.host_tuning).

virtiofsd then exports the bind mount: the guest mounts /models `ro` as well, and even a guest
that remounted it rw would get EROFS from the host kernel. `mount --bind` then
`mount -o remount,bind,ro` (two steps: a bind mount ignores `ro` on its first mount on older
util-linux). Idempotent both ways; refuses a target that is mounted from somewhere else.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from common.errors import Refused


def mount_options(target: Path, mountinfo: str) -> str | None:
    """The per-mount options of the mount at `target` ('ro,relatime'...), None if not a mount point."""
    found = None
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) > 5 and _unescape(fields[4]) == str(target):
            found = fields[5]  # the last mount at a path is the visible one
    return found


def ensure_ro_bind(source: Path, target: Path) -> Path:
    source, target = Path(source).resolve(), Path(target)
    if not source.is_dir():
        raise Refused(f"model directory {source} does not exist")
    target.mkdir(parents=True, exist_ok=True)
    target = target.resolve()
    options = mount_options(target, _mountinfo())
    if options is None:
        _run(["mount", "--bind", str(source), str(target)])
        options = "rw"
    if "ro" not in options.split(","):
        _run(["mount", "-o", "remount,bind,ro", str(target)])
    if "ro" not in (mount_options(target, _mountinfo()) or "").split(","):
        raise Refused(f"{target} did not become a read-only mount")
    return target


def remove_ro_bind(target: Path) -> bool:
    target = Path(target)
    if not target.exists():
        return False
    while mount_options(target.resolve(), _mountinfo()) is not None:
        _run(["umount", str(target)])
    target.rmdir()
    try:
        target.parent.rmdir()  # the per-host directory of these mounts, when it was the last one
    except OSError:
        pass
    return True


def _mountinfo() -> str:
    return Path("/proc/self/mountinfo").read_text()


def _unescape(path: str) -> str:
    return path.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def _run(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0:
        raise Refused(f"{' '.join(argv)} failed: {done.stderr.strip()[:300]}")
