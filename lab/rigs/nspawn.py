"""A fresh Debian 12 system container: mmdebstrap's root file system booted by systemd-nspawn.

What a freshly installed host has and nothing of this machine's: Debian's minimal base with
systemd, its own network namespace reaching the Debian mirror and PyPI through slirp4netns
(user-mode NAT: nothing changes in the host's routing, forwarding or firewall), and DNS from
slirp's resolver, and the CAs this machine's network needs (its TLS egress proxy's, from
/usr/local/share/ca-certificates) as any host on the network would. Commands run inside with nsenter under an empty environment, so none of this
machine's variables (pip's local indexes among them) leak in.

The root file system is built once per package list and kept as a tarball under .state/
(`rootfs_tarball`); every boot unpacks a new copy.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

SUITE = "bookworm"
# What a Debian 12 host installed from the netinst or a cloud image has in sources.list.
MIRRORS = (
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
)
BASE_PACKAGES = ("systemd", "systemd-sysv", "dbus", "ca-certificates")
CONTAINER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TOOLS = ("mmdebstrap", "systemd-nspawn", "slirp4netns", "nsenter", "ip")


def missing_tools() -> list[str]:
    return [t for t in TOOLS if shutil.which(t) is None]


def rootfs_tarball(cache_dir: Path) -> tuple[Path, bool]:
    """(the base system's tarball, whether it was built now): one per suite, mirror and package list."""
    key = hashlib.sha256("\n".join((SUITE, *MIRRORS, *BASE_PACKAGES)).encode()).hexdigest()[:12]
    tarball = cache_dir / f"debian12-{key}.tar"
    if tarball.exists():
        return tarball, False
    cache_dir.mkdir(parents=True, exist_ok=True)
    partial = tarball.with_suffix(".partial.tar")
    subprocess.run(["mmdebstrap", "--quiet", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}",
                    SUITE, str(partial), *MIRRORS], check=True, timeout=900)
    partial.rename(tarball)
    return tarball, True


@dataclass
class Container:
    """One booted container; `stop` halts it and removes its root and network namespace."""

    name: str
    root: Path
    log_path: Path
    nspawn: subprocess.Popen | None = None
    slirp: subprocess.Popen | None = None
    leader: int = 0
    _log: object = field(default=None, repr=False)

    @property
    def netns(self) -> str:
        return self.name

    def boot(self, tarball: Path, timeout: float = 120.0) -> None:
        self.root.mkdir(parents=True)
        subprocess.run(["tar", "-C", str(self.root), "-xf", str(tarball)], check=True, timeout=300)
        (self.root / "etc/hostname").write_text(f"{self.name}\n")
        # As Debian's installer writes them: the loopback names and this host's.
        (self.root / "etc/hosts").write_text(f"127.0.0.1\tlocalhost\n127.0.1.1\t{self.name}\n"
                                             "::1\tlocalhost ip6-localhost ip6-loopback\n")
        local_cas = Path("/usr/local/share/ca-certificates")
        if local_cas.is_dir():
            shutil.copytree(local_cas, self.root / "usr/local/share/ca-certificates", dirs_exist_ok=True)
        # slirp4netns's resolver, as DHCP would hand a fresh host its own.
        resolv = self.root / "etc/resolv.conf"
        resolv.unlink(missing_ok=True)
        resolv.write_text("nameserver 10.0.2.3\n")
        subprocess.run(["ip", "netns", "add", self.netns], check=True)
        subprocess.run(["ip", "-n", self.netns, "link", "set", "lo", "up"], check=True)
        self._log = self.log_path.open("ab")
        self.slirp = subprocess.Popen(
            ["slirp4netns", "--configure", "--mtu=65520", "--disable-host-loopback", "--netns-type=path",
             f"/run/netns/{self.netns}", "tap0"], stdout=self._log, stderr=subprocess.STDOUT)
        self.nspawn = subprocess.Popen(
            ["systemd-nspawn", "--quiet", "--boot", f"--directory={self.root}", f"--machine={self.name}",
             "--register=no", "--keep-unit", f"--network-namespace-path=/run/netns/{self.netns}",
             "--resolv-conf=off", "--console=read-only"], stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.nspawn.poll() is not None:
                raise RuntimeError(f"systemd-nspawn exited {self.nspawn.returncode}; see {self.log_path}")
            children = subprocess.run(["pgrep", "-P", str(self.nspawn.pid)], capture_output=True, text=True).stdout.split()
            if children:
                self.leader = int(children[0])
                state = self.run("systemctl is-system-running", check=False, timeout=10).stdout.strip()
                if state in ("running", "degraded"):
                    self.run("update-ca-certificates >/dev/null")
                    return
            time.sleep(0.5)
        raise RuntimeError(f"the container's systemd did not finish booting in {timeout:.0f} s; see {self.log_path}")

    def run(self, command: str, *, env: dict[str, str] | None = None, input: str | None = None,
            check: bool = True, timeout: float = 600.0) -> subprocess.CompletedProcess:
        """bash -c COMMAND inside, as root, under an environment of PATH, HOME, LANG and ENV only
        (INPUT on its stdin; a secret goes in ENV or INPUT, never in COMMAND)."""
        base = {"PATH": CONTAINER_PATH, "HOME": "/root", "LANG": "C.UTF-8", "TERM": "dumb", **(env or {})}
        argv = ["nsenter", "-t", str(self.leader), "-m", "-u", "-i", "-n", "-p", "-r", "-w", "--",
                "env", "-i", *(f"{k}={v}" for k, v in base.items()), "bash", "-c", command]
        result = subprocess.run(argv, capture_output=True, text=True, input=input, timeout=timeout,
                                stdin=None if input is not None else subprocess.DEVNULL)
        if check and result.returncode != 0:
            raise RuntimeError(f"in the container, `{command}` exited {result.returncode}:\n"
                               f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
        return result

    def stop(self) -> None:
        if self.nspawn is not None and self.nspawn.poll() is None:
            # The container is thrown away: SIGKILL to its init ends its whole PID namespace at
            # once (an orderly halt waits on every unit's stop timeout), and nspawn then exits.
            if self.leader:
                os.kill(self.leader, signal.SIGKILL)
            try:
                self.nspawn.wait(20)
            except subprocess.TimeoutExpired:
                self.nspawn.kill()
                self.nspawn.wait(10)
        if self.slirp is not None and self.slirp.poll() is None:
            self.slirp.terminate()
            self.slirp.wait(10)
        if os.path.exists(f"/run/netns/{self.netns}"):
            subprocess.run(["ip", "netns", "del", self.netns], check=False)
        if self._log is not None:
            self._log.close()
        shutil.rmtree(self.root, ignore_errors=True)
