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


def own_dir(path: Path) -> Path:
    """A directory for another host's key (`fabricd pki issue-client --out`): made 0700 when
    absent; an existing one must be a real directory (not a symlink) owned by this user that no
    one else may write, else ValueError. A directory another local user prepared could let them
    swap in a link or read the key."""
    path = Path(path)
    try:
        st = path.lstat()
    except FileNotFoundError:
        path.mkdir(parents=True, mode=DIR_MODE)
        os.chmod(path, DIR_MODE)
        return path
    if not stat.S_ISDIR(st.st_mode):
        raise ValueError(f"{path} is not a directory (a symlink is refused); name a new directory")
    if st.st_uid != os.geteuid():
        raise ValueError(f"{path} belongs to uid {st.st_uid}, not to you; name a directory you own, or a new one")
    if st.st_mode & 0o022:
        raise ValueError(f"{path} is writable by others (mode {stat.S_IMODE(st.st_mode):o}); name a directory "
                         "only you may write, or a new one")
    os.chmod(path, DIR_MODE)
    return path


def write_new(path: Path, data: bytes, mode: int = FILE_MODE) -> None:
    """Replace ``path`` with a new file of ``mode`` from creation: an old file (or a link by its
    name) is unlinked, never followed, and the new one is opened O_EXCL|O_NOFOLLOW."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(path, mode, follow_symlinks=False)


def touch_private(path: Path) -> None:
    """Create `path` empty with 0600 when absent, else make it 0600 (keeps its content)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, FILE_MODE)
    os.close(fd)
    os.chmod(path, FILE_MODE)


def restrict_umask() -> int:
    """Make every later file of this process 0600/0700 by default; returns the old umask."""
    return os.umask(0o077)
