"""Secret files: after a real `fabricd init` + `serve` (TLS) and an agent start, the state dirs
are 0700 and every file in them (store, -wal/-shm, CA and keys, passwords) grants nothing to
group or others. The store holds the key that signs admin tokens: readable by anyone, it lets
any local user forge an admin token."""

from __future__ import annotations

import stat
import subprocess
from pathlib import Path

import httpx

from lab.rigs.polling import wait_for
from lab.rigs.servers import free_port
from tests.controlplane.conftest import BIN, fabricd_env, login, start_fabricd


def _loose(root: Path) -> list[str]:
    """Every path under root (root included) with a group/other bit set, with its mode."""
    bad = []
    for path in [root, *root.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        if mode & 0o077:
            bad.append(f"{path.relative_to(root.parent)} {oct(mode)}")
    return bad


def test_fabricd_state_is_private_after_init_and_serve(tmp_path):
    with start_fabricd(tmp_path, insecure=False) as server:
        assert login(server)  # the app wrote its token key into the store at start
        names = {p.name for p in server.state_dir.rglob("*")}
        assert {"fabric.db", "fabric.db-wal", "fabric.db-shm", "admin-password", "ca.key"} <= names, names
        assert _loose(server.state_dir) == []


def test_a_store_made_before_the_rule_is_tightened(tmp_path):
    from common.private_fs import private_dir
    from common.store.sqlite_store import SqliteStore

    d = tmp_path / "old"
    d.mkdir(mode=0o700)
    (d / "fabric.db").touch(mode=0o644)
    (d / "fabric.db").chmod(0o644)
    SqliteStore(d / "fabric.db").put("/k", "v")
    assert _loose(d) == []
    shared = tmp_path / "shared"  # a directory the store did not make (say /tmp) keeps its mode
    shared.mkdir(mode=0o755)
    shared.chmod(0o1777)
    store = SqliteStore(shared / "fabric.db")  # kept open: closing the last connection removes -wal/-shm
    store.put("/k", "v")
    private_dir(shared)  # a sticky, shared directory is left as it is
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in shared.iterdir()} == {
        "fabric.db": 0o600, "fabric.db-wal": 0o600, "fabric.db-shm": 0o600}
    made = tmp_path / "new" / "deeper"
    SqliteStore(made / "fabric.db")
    assert stat.S_IMODE(made.stat().st_mode) == 0o700


def test_agent_state_dir_is_private(tmp_path):
    state = tmp_path / "agent"
    port = free_port()
    with open(tmp_path / "agent.log", "wb") as log:
        proc = subprocess.Popen([str(BIN / "fabric-agent"), "serve", "--node-id", "n1", "--insecure",
                                 "--listen", f"127.0.0.1:{port}", "--state-dir", str(state),
                                 "--vm-driver", "dry-run", "--no-dataplane"],
                                stdout=log, stderr=subprocess.STDOUT, env=fabricd_env())
    try:
        def answers() -> bool:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code < 500:
                    return True
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, (tmp_path / "agent.log").read_text()
            return False

        wait_for(answers, 30, f"the agent's /healthz (log: {tmp_path / 'agent.log'})", interval=0.2)
        assert _loose(state) == []
    finally:
        proc.terminate()
        proc.wait(10)
