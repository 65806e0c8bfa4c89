"""Per-replica qcow2 overlays on the golden image.

`qemu-img create -f qcow2 -b GOLDEN -F qcow2 OVERLAY`: the guest writes only to its
overlay, so the golden image is never written and one golden serves every replica on the
host. The backing format is always given (-F) so qemu never probes it (a probed raw
backing file is a known escape route). Deleting a replica deletes only its overlay.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from common.errors import NotFound, Refused


def create_overlay(golden: Path, overlay: Path, *, size_gib: int | None = None) -> Path:
    """Create the overlay if absent (idempotent); refuses one that backs onto another image."""
    golden = Path(golden).resolve()
    if not golden.is_file():
        raise NotFound(f"golden image {golden} does not exist (bake it with scripts/bake-ai-vllm-image.sh)")
    if overlay.exists():
        backing = backing_file(overlay)
        if backing != str(golden):
            raise Refused(f"{overlay} exists with backing file {backing!r}, not {golden}")
        return overlay
    qemu_img = shutil.which("qemu-img")
    if qemu_img is None:
        raise Refused("qemu-img is not installed (apt-get install qemu-utils)")
    overlay.parent.mkdir(parents=True, exist_ok=True)
    command = [qemu_img, "create", "-q", "-f", "qcow2", "-b", str(golden), "-F", "qcow2", str(overlay)]
    if size_gib:
        command.append(f"{size_gib}G")
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise Refused(f"qemu-img could not create {overlay}: {done.stderr.strip()[:300]}")
    return overlay


def backing_file(image: Path) -> str | None:
    qemu_img = shutil.which("qemu-img")
    if qemu_img is None:
        raise Refused("qemu-img is not installed (apt-get install qemu-utils)")
    # -U: read even while a running QEMU holds the image's lock.
    done = subprocess.run(
        [qemu_img, "info", "-U", "--output=json", str(image)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise Refused(f"qemu-img could not read {image}: {done.stderr.strip()[:300]}")
    info = json.loads(done.stdout)
    return info.get("full-backing-filename") or info.get("backing-filename")
