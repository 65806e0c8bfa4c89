"""`fabricd init` once per test run: a template state dir that each test fabricd starts from a copy of.

`fabricd init` is a Python start (typer, cryptography) that writes two passwords, the cluster CA
and fabricd's server certificate; dozens of test modules start a fabricd, and each init costs
about a second on a busy 2-core machine. The template is made by the real command, once per
process; every copy gets passwords of its own (written as `fabricd init` writes them), so no
two test fabricds accept one password. The CA and the server certificate are the template's:
one cluster CA per run. A test about `fabricd init` itself, or one that needs two clusters with
different CAs, runs the command.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from controlplane.auth import PASSWORD_FILES, ensure_password
from lab.rigs.polling import clean_env

BIN = Path(sys.executable).parent


@functools.lru_cache(maxsize=1)
def _template() -> Path:
    root = Path(tempfile.mkdtemp(prefix="fabricd-init-template-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    state = root / "state"
    subprocess.run([str(BIN / "fabricd"), "init", "--state-dir", str(state)], check=True,
                   capture_output=True, env=clean_env())
    return state


def init_state(state_dir: Path) -> None:
    """What `fabricd init --state-dir state_dir` leaves (modes included), with fresh passwords."""
    shutil.copytree(_template(), state_dir)  # copy2: the 0700 directories and 0600 files stay so
    for user, name in PASSWORD_FILES.items():
        (state_dir / name).unlink()
        ensure_password(state_dir, user)
