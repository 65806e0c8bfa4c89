"""Every change goes through controlplane.ops: no REST route (controlplane/api) and no console
module (controlplane/console) writes a record, an event or a raw store key itself.

Read from the source (AST): a call is a write when it reaches a writer module (the records layer,
the event writer, the store, and the modules that own a record of their own: API keys, users,
join tokens, node certificates, the restore writer, the model-job worker) and its function's name
is a write verb (put, create, update, delete, record, grant, ...), or when it is one of the named
writer functions. Reads (get, list, stored, versioned, ...) stay allowed: a route may look before
it asks ops to act.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
CHECKED = ("controlplane/api", "controlplane/console")
# Modules whose functions write the store (a prefix matches the module and its submodules).
WRITERS = ("common.records", "controlplane.records", "common.store", "common.records.events",
           "controlplane.orchestration_state", "common.apikeys", "controlplane.join_tokens",
           "controlplane.node_certs", "controlplane.tenancy.users", "controlplane.tenancy.revocation",
           "controlplane.backup.store_io", "controlplane.models.worker")
WRITE_VERBS = ("put", "create", "update", "upsert", "delete", "discard", "cas", "swap", "write", "save",
               "record", "restart", "grant", "revoke", "consume", "prune", "forget", "mark", "activate",
               "refresh", "set", "claim", "release", "take", "append")
WRITER_NAMES = {"EventSink", "record_event"}
# Raw store verbs on anything named store (state.store, a local store).
RAW_WRITES = {"put", "create", "delete", "cas", "grant_lease", "revoke_lease", "put_many", "txn"}


def _is_write(name: str) -> bool:
    return name in WRITER_NAMES or any(name == v or name.startswith(v + "_") for v in WRITE_VERBS)


def _writer(module: str) -> bool:
    return any(module == w or module.startswith(w + ".") for w in WRITERS)


def _imports(tree: ast.Module) -> dict[str, str]:
    """Local name -> the dotted module (or module.function) it stands for, for writer imports."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if _writer(a.name):
                    out[(a.asname or a.name).split(".")[0]] = a.name
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                full = f"{node.module}.{a.name}"
                if _writer(node.module) or _writer(full):
                    out[a.asname or a.name] = full
    return out


def _chain(func: ast.expr) -> list[str]:
    parts = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if isinstance(func, ast.Name):
        parts.append(func.id)
    return parts[::-1]


def writes_in(path: Path) -> list[str]:
    """'file:line call' for every record/event/store write in the module at ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    imported = _imports(tree)
    rel = path.relative_to(ROOT)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        chain = _chain(node.func)
        if not chain:
            continue
        name = chain[-1]
        root = chain[0]
        if (root in imported and _is_write(name)) or (len(chain) == 1 and root in imported
                                                        and root in WRITER_NAMES):
            found.append(f"{rel}:{node.lineno} {'.'.join(chain)}")
        elif len(chain) >= 2 and chain[-2] == "store" and name in RAW_WRITES:
            found.append(f"{rel}:{node.lineno} {'.'.join(chain)}")
    return found


def every_write() -> list[str]:
    return [w for folder in CHECKED for path in sorted((ROOT / folder).glob("*.py")) for w in writes_in(path)]


def test_no_route_or_console_action_writes_outside_ops():
    writes = every_write()
    assert writes == [], "these write records themselves; move each into controlplane.ops:\n" + "\n".join(writes)


def test_the_check_sees_each_kind_of_write(tmp_path, monkeypatch):
    """The check is not vacuous: a records verb, an event, a named writer function and a raw store
    write are each caught, and reads are not."""
    folder = tmp_path / "controlplane" / "api"
    folder.mkdir(parents=True)
    (folder / "bad.py").write_text(
        "from common.records import sites\n"
        "from common.records import nodes as node_records\n"
        "from common.records.model_jobs import put_job, list_jobs\n"
        "from common.records.events import record_event\n"
        "def route(state):\n"
        "    sites.get(state.store, 'a')\n"
        "    list_jobs(state.store)\n"
        "    state.store.get('k')\n"
        "    sites.put(state.store, None)\n"
        "    node_records.update(state.store, 'n', None)\n"
        "    put_job(state.store, None, 1)\n"
        "    record_event(state.store, 'site', 'a', 'x', 'y')\n"
        "    state.store.delete('k')\n")
    monkeypatch.setattr(__import__(__name__, fromlist=["ROOT"]), "ROOT", tmp_path)
    assert [w.split(" ")[1] for w in writes_in(folder / "bad.py")] == [
        "sites.put", "node_records.update", "put_job", "record_event", "state.store.delete"]
