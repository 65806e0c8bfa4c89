"""What a clone of this checkout holds, copied elsewhere: for builds that must not see build
outputs, venvs or caches (a wheel built from it is the wheel a user builds)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def checkout_copy(dest: Path) -> None:
    """Tracked and untracked-but-not-ignored files into DEST, symlinks kept as links."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src, dst = REPO / rel, dest / rel
        if not src.exists() and not src.is_symlink():
            continue  # deleted in the working tree
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            dst.symlink_to(src.readlink())
        else:
            shutil.copy2(src, dst)
