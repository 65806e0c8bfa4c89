"""One settings object per process: only the settings modules and the CLIs' entry points read
the process environment. Every other module gets its values from the settings object its
process built at start (controlplane/settings.py, agent/settings.py, gateway/settings.py and
the per-subsystem settings modules they hold, fabricctl/settings.py; the engine simulator takes
all of its settings from flags, enginesim/settings.py), so a value is validated once, with one range
rule, and a bad value stops the process at start naming the variable.

The scan is of the source (AST): any use of `os.environ`, `os.environb`, `os.getenv`,
`os.putenv` or `os.unsetenv`, or a name imported from os as one of them, fails outside ALLOWED.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("common", "controlplane", "agent", "gateway", "fabricctl", "enginesim")
ENV_NAMES = {"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"}

# path (relative to the repository) or folder ending in "/" -> why it may read the environment
ALLOWED = {
    # settings modules: read once at start, validate, build the frozen object
    "controlplane/settings.py": "fabricd's settings",
    "agent/settings.py": "the agent's settings",
    "gateway/settings.py": "the gateway's settings",
    "fabricctl/settings.py": "fabricctl's settings (FABRIC_URL, FABRIC_TOKEN, the passwords, its config file)",
    # the CLIs' entry points: their own flags' environment defaults, and the environment they
    # hand to the processes they start
    "controlplane/cli_fabricd.py": "fabricd's CLI",
    "controlplane/cli_store.py": "fabricd store init-auth (FABRIC_ETCD_* for its TLS)",
    "lab/": "the lab CLI: it starts processes with the caller's environment",
    "lab/run_main.py": "the lab's process entry point (fabric-lab run)",
    "agent/cli.py": "the agent's CLI",
    "agent/server_cli.py": "the agent's serve entry point",
    "agent/join_cli.py": "fabric-agent join (the one-time token from $FABRIC_JOIN_TOKEN or $CREDENTIALS_DIRECTORY, never argv)",
    "agent/vm/vllm_launcher.py": "the launcher process started inside a VM",
    "agent/vm/engine_env.py": "an engine child's environment: the agent's PATH and locale passed through, nothing else",
    "agent/dataplane/cli.py": "fabric-agent dataplane: its own process's FABRIC_UDP_FLOW_SECS etc. for the maps it makes",
    "gateway/cli.py": "the gateway's CLI (prometheus_client's multiprocess directory)",
    "common/cli_guard.py": "the CLIs' error guard (FABRIC_DEBUG: a traceback)",
}


def _allowed(rel: str) -> bool:
    return any(rel == p or (p.endswith("/") and rel.startswith(p)) for p in ALLOWED)


def env_reads(source: str) -> list[int]:
    """Line numbers of every environment access in `source`."""
    tree = ast.parse(source)
    os_names = {"os"}
    direct: set[str] = set()
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "os":
                    os_names.add(a.asname or "os")
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            for a in node.names:
                if a.name in ENV_NAMES:
                    direct.add(a.asname or a.name)
                    lines.append(node.lineno)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr in ENV_NAMES
                and isinstance(node.value, ast.Name) and node.value.id in os_names):
            lines.append(node.lineno)
        elif isinstance(node, ast.Name) and node.id in direct:
            lines.append(node.lineno)
    return sorted(set(lines))


def all_reads() -> dict[str, list[int]]:
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            found = env_reads(path.read_text())
            if found:
                out[rel] = found
    return out


def test_only_settings_modules_and_entry_points_read_the_environment():
    outside = {rel: lines for rel, lines in all_reads().items() if not _allowed(rel)}
    assert not outside, ("os.environ read outside the settings modules and the CLIs' entry points "
                         "(take the value from the process's settings object instead): "
                         + ", ".join(f"{rel}:{','.join(map(str, lines))}" for rel, lines in outside.items()))


def test_the_scan_finds_every_spelling():
    src = ("import os\nimport os as o\nfrom os import environ, getenv as g\n"
           "a = os.environ['X']\nb = o.getenv('Y')\nc = environ.get('Z')\nd = g('W')\n"
           "e = os.path.join('a')\n")
    assert env_reads(src) == [3, 4, 5, 6, 7]
