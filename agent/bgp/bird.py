"""BIRD 2 as the agent's BGP speaker: the configuration it is given, and the process.

`render_config` is pure: settings + the prefixes to announce -> the whole configuration. The
announced /32s are static blackhole routes in protocol `vips` exported to every peer (BIRD never
installs them in a kernel table: there is no kernel protocol), so a reload with another set is
a diff BIRD computes itself: sessions stay up and only updates and withdrawals go out.

`BirdDaemon` runs `bird -f` as the agent's child in the dataplane's network namespace, with
its parent-death signal set to SIGKILL so that an agent that dies, however it dies, takes BIRD with it: the kernel
closes BIRD's TCP sessions and every peer withdraws the node's routes at once. Reloads and
status go through `birdc` on the daemon's own control socket.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from agent.dataplane.netns import NETNS_DIR
from agent.settings import BgpSettings

STATIC_PROTOCOL = "vips"


class BirdError(RuntimeError):
    """BIRD refused a configuration, or could not be started or reached."""


def render_config(settings: BgpSettings, prefixes: Sequence[str], log_path: str | None = None) -> str:
    """The whole BIRD configuration for this node; prefixes are "A.B.C.D/32" strings."""
    lines = ["# written by fabric-agent (agent/bgp/bird.py); every reload replaces it whole"]
    if log_path:
        lines.append(f'log "{log_path}" all;')
    if settings.router_id:
        lines.append(f"router id {settings.router_id};")
    lines += [
        'timeformat protocol "%s";',  # one token in `show protocols` (parse_protocols)
        "protocol device { scan time 5; }",
        f"protocol static {STATIC_PROTOCOL} {{",
        "  ipv4;",
        *[f"  route {p} blackhole;" for p in prefixes],
        "}",
        "filter fabric_export {",
        f'  if proto != "{STATIC_PROTOCOL}" then reject;',
        *[f"  bgp_community.add(({a},{b}));" for a, b in settings.communities],
        "  accept;",
        "}",
    ]
    if settings.bfd:
        lines += ["protocol bfd {",
                  (f'  interface "*" {{ min rx interval {settings.bfd_interval_ms} ms; '
                  f"min tx interval {settings.bfd_interval_ms} ms; multiplier 3; }};"),
                  "}"]
    for peer in settings.peers:
        lines += [
            f"protocol bgp {peer.name} {{",
            f"  local as {settings.local_asn};",
            f"  neighbor {peer.address} as {peer.asn};",
            f"  hold time {settings.hold_secs};",
            f"  keepalive time {settings.keepalive_secs};",
            # a refused or lost peer is tried again within seconds, not BIRD's default minutes
            "  connect retry time 2;",
            "  error wait time 1, 8;",
            "  bfd on;" if settings.bfd else "  bfd off;",
            "  ipv4 { import none; export filter fabric_export; next hop self; };",
            "}",
        ]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class ProtocolState:
    name: str
    proto: str
    state: str  # BIRD's: up, start, down, ...
    info: str  # BGP: Established, Active, Connect, Idle... then any "Socket: ..." detail

    @property
    def established(self) -> bool:
        return self.state == "up" and self.info.startswith("Established")


def parse_protocols(text: str) -> dict[str, ProtocolState]:
    """`birdc show protocols` (with timeformat protocol "%s") -> name -> state."""
    out = {}
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 5 or parts[0] in ("Name", "BIRD") or not parts[4].isdigit():
            continue
        name, proto, _table, state, _since = parts[:5]
        out[name] = ProtocolState(name, proto, state, " ".join(parts[5].split()) if len(parts) > 5 else "")
    return out


def launch_command(bird: str, config: Path, socket_path: Path, netns: str | None) -> list[str]:
    """bird in the foreground, its parent-death signal SIGKILL (setpriv; it survives the exec of
    nsenter and bird), in `netns` when given (nsenter --net: the mount namespace stays ours)."""
    cmd = ["setpriv", "--pdeathsig", "KILL"]
    if netns is not None:
        cmd += ["nsenter", f"--net={os.path.join(NETNS_DIR, netns)}", "--"]
    return cmd + [bird, "-f", "-c", str(config), "-s", str(socket_path)]


class BirdDaemon:
    """One BIRD process: started by `start`, reloaded by `configure`, stopped by `stop`."""

    def __init__(self, settings: BgpSettings, run_dir: Path, netns: str | None = None):
        self.settings = settings
        self.run_dir = Path(run_dir)
        self.netns = netns
        self.config_path = self.run_dir / "bird.conf"
        self.socket_path = self.run_dir / "bird.ctl"
        self.log_path = self.run_dir / "bird.log"
        self._proc: subprocess.Popen | None = None
        bird = shutil.which(settings.bird)
        if bird is None:
            raise BirdError(f"FABRIC_BGP_BIRD: {settings.bird!r} not found (Debian package bird2)")
        self.bird = bird
        birdc = shutil.which(str(Path(bird).with_name("birdc"))) or shutil.which("birdc")
        if birdc is None:
            raise BirdError(f"birdc not found beside {bird}")
        self.birdc = birdc

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _write(self, prefixes: Sequence[str]) -> None:
        text = render_config(self.settings, prefixes, str(self.log_path))
        tmp = self.config_path.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, self.config_path)

    def start(self, prefixes: Sequence[str] = ()) -> None:
        """Start BIRD with `prefixes` announced; returns once its control socket answers.
        Call it from a thread that lives as long as the daemon should (PDEATHSIG follows the
        thread that forked it)."""
        self.run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._write(prefixes)
        self.socket_path.unlink(missing_ok=True)
        if self.netns is not None and "/" in self.netns:
            raise BirdError(f"network namespace name {self.netns!r} has a slash")
        with open(self.run_dir / "bird.stderr", "ab") as log:
            # its own session: a Ctrl-C at the agent's terminal reaches the agent, which stops it
            self._proc = subprocess.Popen(launch_command(self.bird, self.config_path, self.socket_path, self.netns),
                                          stdin=subprocess.DEVNULL, stdout=log, stderr=log, close_fds=True,
                                          start_new_session=True)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise BirdError(f"bird exited with {self._proc.returncode} at start; see {self.run_dir}/bird.stderr")
            if self.socket_path.exists() and self._birdc("show", "status", check=False)[0] == 0:
                return
            time.sleep(0.05)
        raise BirdError(f"bird did not open {self.socket_path} within 10 s")

    def _birdc(self, *args: str, check: bool = True) -> tuple[int, str]:
        try:
            res = subprocess.run([self.birdc, "-s", str(self.socket_path), *args], capture_output=True,
                                 text=True, timeout=10)
        except subprocess.TimeoutExpired:
            if check:
                raise BirdError(f"birdc {' '.join(args)} timed out") from None
            return 1, ""
        if check and res.returncode != 0:
            raise BirdError(f"birdc {' '.join(args)}: {(res.stdout + res.stderr).strip()}")
        return res.returncode, res.stdout

    def configure(self, prefixes: Sequence[str]) -> None:
        """Announce exactly `prefixes` (a reload: sessions stay up)."""
        self._write(prefixes)
        _, out = self._birdc("configure", f'"{self.config_path}"')
        if "Reconfigured" not in out and "Reconfiguration in progress" not in out:
            raise BirdError(f"bird refused the configuration: {out.strip()}")

    def protocols(self) -> dict[str, ProtocolState]:
        return parse_protocols(self._birdc("show", "protocols")[1])

    def exported(self, peer: str) -> int:
        """How many routes BIRD has exported to one peer's session (`show protocols all`)."""
        _, out = self._birdc("show", "protocols", "all", peer)
        for line in out.splitlines():
            words = line.split()
            if words[:1] == ["Routes:"]:
                for i, w in enumerate(words):
                    if w.startswith("exported") and i > 0:
                        return int(words[i - 1])
        return 0

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM: BIRD closes its sessions with a Cease notification (peers withdraw at once)."""
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout)
        self._proc = None
