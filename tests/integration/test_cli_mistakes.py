"""The no-traceback table: common mistakes through the real console scripts (fabricd,
fabric-agent, fabric-gateway, fabricctl). Each must end in one `error: ...` naming the file,
variable, flag or address, with the documented exit status (1 refused, 2 usage, 3 unreachable),
and never print a Python traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from lab.rigs.servers import free_port

BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def state(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("mistakes") / "state"
    subprocess.run([str(BIN / "fabricd"), "init", "--state-dir", str(d)], check=True, capture_output=True)
    return d


def _cases(state: Path, tmp: Path) -> list[tuple[list[str], dict[str, str], int, str]]:
    dead = f"127.0.0.1:{free_port()}"
    listen = f"127.0.0.1:{free_port()}"
    bad_cfg = tmp / "badcfg"
    bad_cfg.mkdir(exist_ok=True)
    (bad_cfg / "config").write_text("contexts: [unclosed")
    return [
        # fabricd
        (["fabricd", "init", "--state-dir", "/proc/no/such"], {}, 2, "/proc/no: No such file or directory"),
        (["fabricd", "serve", "--state-dir", str(tmp / "never-init")], {}, 2, "fabricd init --state-dir"),
        (["fabricd", "serve", "--state-dir", str(state), "--listen", "nonsense"], {}, 2, "--listen 'nonsense'"),
        (["fabricd", "serve", "--state-dir", str(state), "--store", "mysql://x"], {}, 2, "store URL 'mysql://x'"),
        (["fabricd", "serve", "--state-dir", str(state), "--insecure", "--listen", listen, "--store",
          f"etcd://{dead}"], {}, 3, f"etcd at {dead} unreachable"),
        (["fabricd", "serve", "--state-dir", str(state), "--insecure", "--listen", listen],
         {"FABRIC_RECONCILE_SECS": "soon"}, 2, "FABRIC_RECONCILE_SECS='soon' is not a number"),
        (["fabricd", "serve", "--state-dir", str(state), "--listen", "0.0.0.0:1", "--insecure"], {}, 2,
         "loopback"),
        (["fabric-lab", "demo"], {"FABRIC_LAB_STATE": str(tmp / "no-lab")}, 1, "the lab is not up"),
        # fabric-agent
        (["fabric-agent", "serve", "--node-id", "n1", "--pki-dir", str(tmp / "no-pki")], {}, 2,
         "TLS files not found"),
        (["fabric-agent", "serve", "--node-id", "Bad_Id", "--insecure"], {}, 2, "--node-id 'Bad_Id'"),
        (["fabric-agent", "serve", "--node-id", "n1", "--insecure", "--vm-driver", "xen"], {}, 2, "--vm-driver 'xen'"),
        (["fabric-agent", "serve", "--node-id", "n1", "--insecure", "--listen", listen, "--vm-driver", "dry-run",
          "--no-dataplane", "--fake-gpus", "1", "--state-dir", str(tmp / "agent"), "--control-plane", "fabricd:8443"],
         {}, 2, "--control-plane 'fabricd:8443'"),
        # fabric-gateway
        (["fabric-gateway", "serve", "--state-dir", str(state), "--insecure", "--listen", listen], {}, 2,
         "FABRIC_KEY_HMAC_SECRET"),
        (["fabric-gateway", "serve", "--state-dir", str(state), "--listen", listen, "--tls-cert", "/no/c.pem",
          "--tls-key", "/no/k.pem"], {"FABRIC_KEY_HMAC_SECRET": "x" * 32}, 2, "--tls-cert /no/c.pem"),
        (["fabric-gateway", "serve", "--state-dir", "/proc/no/such", "--listen", listen],
         {"FABRIC_KEY_HMAC_SECRET": "x" * 32}, 2, "/proc/no: No such file or directory"),
        # fabricctl
        (["fabricctl", "ai", "model", "list"], {"FABRIC_URL": "127.0.0.1:8443"}, 2, "FABRIC_URL '127.0.0.1:8443'"),
        (["fabricctl", "ai", "model", "list"], {"FABRIC_URL": "https://[::1"}, 2, "FABRIC_URL"),
        (["fabricctl", "ai", "model", "list"], {"FABRIC_CA": "/no/ca.crt"}, 2, "FABRIC_CA names /no/ca.crt"),
        (["fabricctl", "ai", "model", "list"], {"FABRIC_CA": str(state / "admin-password")}, 2,
         f"cannot load the CA {state / 'admin-password'}"),
        (["fabricctl", "ai", "model", "list"], {"FABRIC_URL": f"https://{dead}"}, 3, f"cannot reach fabricd at https://{dead}"),
        (["fabricctl", "--context", "nope", "ai", "model", "list"], {}, 2, "context 'nope' is not in"),
        (["fabricctl", "ai", "model", "list"], {"FABRIC_CONFIG_DIR": str(bad_cfg)}, 2, str(bad_cfg / "config")),
        (["fabricctl", "--token-file", "/no/token", "ai", "model", "list"], {}, 2, "--token-file /no/token"),
        (["fabricctl", "ai", "login", "--password-file", "/no/pw"], {}, 2, "--password-file /no/pw"),
        (["fabricctl", "ai", "model", "list", "-o", "xml"], {}, 2, "'xml' is not one of"),
        (["fabricctl", "ai", "nosuch"], {}, 2, "No such command 'nosuch'"),
        (["fabricctl", "ai", "apply", "-f", "/no/such.yaml"], {}, 2, "-f /no/such.yaml: no such file"),
    ]


def test_mistakes_end_in_one_error_line_and_the_documented_status(state, tmp_path):
    base = {k: v for k, v in os.environ.items() if not k.startswith("FABRIC_")}
    base.update(HOME=str(tmp_path), XDG_CONFIG_HOME=str(tmp_path / "xdg"))

    def check(case) -> str | None:
        args, env, code, words = case
        proc = subprocess.run([str(BIN / args[0]), *args[1:]], capture_output=True, text=True,
                              env={**base, **env}, timeout=60, cwd=tmp_path)
        out = proc.stdout + proc.stderr
        if "Traceback" in out or proc.returncode != code or words not in out:
            return f"{' '.join(args)} {env}: rc={proc.returncode} (want {code}), want {words!r}:\n{out[-800:]}"
        return None

    # Every case refuses before serving anything (nothing binds or locks), so they run side by
    # side: 28 interpreter start-ups, ~24 s one after another on 2 cores.
    with ThreadPoolExecutor(max_workers=4) as pool:
        failures = [f for f in pool.map(check, _cases(state, tmp_path)) if f]
    assert not failures, "\n\n".join(failures)
