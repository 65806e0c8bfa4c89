"""Files that hold a secret or the store: 0600 from creation, in a 0700 directory.

fabricd's store holds the secret that signs admin tokens, so the store file (and SQLite's -wal and
-shm, which SQLite creates with the database file's mode), the CA and leaf keys, the password
files, the key HMAC secret and the lab's env/token files are written here and nowhere else.
`private_dir` also tightens a directory that already exists (an install made before this rule).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600


def private_dir(path: Path, mode: int = DIR_MODE) -> Path:
    """Create `path` (and parents) and make it `mode` (0700); returns it. A sticky directory
    (/tmp and the like: shared by design) is left as it is; the files in it are still 0600."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True, mode=mode)
    if not path.stat().st_mode & stat.S_ISVTX:
        os.chmod(path, mode)
    return path


def write_private(path: Path, data: str | bytes) -> None:
    """Write `data` to `path`, 0600 from creation (never briefly readable by others)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)
    os.chmod(path, FILE_MODE)


def touch_private(path: Path) -> None:
    """Create `path` empty with 0600 when absent, else make it 0600 (keeps its content)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, FILE_MODE)
    os.close(fd)
    os.chmod(path, FILE_MODE)


def restrict_umask() -> int:
    """Make every later file of this process 0600/0700 by default; returns the old umask."""
    return os.umask(0o077)
