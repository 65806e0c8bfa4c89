"""PID 1 of the tiny guest (lab/rigs/tiny_guest.py copies it to /sbin/fabric-guest-init).

It stands in for cloud-init and systemd, doing with our NoCloud seed what they would do:
reads meta-data/user-data from the cidata cdrom, sets the hostname, brings the first NIC up
by DHCP (the seed has no network-config, so cloud-init's default applies), writes the seed's
write_files, turns `mounts` into /etc/fstab, and runs the seed's runcmd: `systemctl enable
--now UNIT` starts UNIT from the unit file the seed wrote (ExecStart, Environment, User,
Type=oneshot|simple, Requires=, Restart=on-failure, StandardOutput=/StandardError= as systemd
routes them: to the serial console only where the value names the console, else to a journal
stand-in under /var/log/journal/), so the engine unit the driver rendered runs as written. Units the image does not carry (qemu-guest-agent) are logged and skipped.

Every step prints one `fabric-guest-init: T+SECONDS what` line to the serial console, which
libvirt copies to the replica's console log: scripts/vm-boot-check reads its timings there.
Runs on the guest's own Python (stdlib + PyYAML); nothing here runs on the host.
"""

import os
import pwd
import shlex
import subprocess
import sys
import time
from pathlib import Path

import yaml

START = time.monotonic()
CIDATA = "/run/cidata"


def say(text):
    uptime = Path("/proc/uptime").read_text().split()[0] if os.path.exists("/proc/uptime") else "?"
    line = f"fabric-guest-init: T+{uptime}s {text}\n"
    with open("/dev/console", "w") as console:
        console.write(line)


def run(argv, check=False):
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        say(f"{' '.join(argv)} -> {done.returncode}: {(done.stderr or done.stdout).strip()[:200]}")
        if check:
            raise SystemExit(1)
    return done


def mount_basics():
    for fs, target in (("proc", "/proc"), ("sysfs", "/sys"), ("devtmpfs", "/dev"), ("tmpfs", "/run"),
                       ("tmpfs", "/tmp")):
        os.makedirs(target, exist_ok=True)
        if not os.path.ismount(target):
            run(["mount", "-t", fs, fs, target])


def read_seed():
    os.makedirs(CIDATA, exist_ok=True)
    for _ in range(100):
        if os.path.exists("/dev/sr0"):
            break
        time.sleep(0.1)
    run(["mount", "-t", "iso9660", "-o", "ro", "/dev/sr0", CIDATA], check=True)
    meta = yaml.safe_load(Path(f"{CIDATA}/meta-data").read_text()) or {}
    user_text = Path(f"{CIDATA}/user-data").read_text()
    if not user_text.startswith("#cloud-config"):
        say("user-data is not #cloud-config")
        raise SystemExit(1)
    return meta, yaml.safe_load(user_text) or {}


def network_up():
    nic = min(n for n in os.listdir("/sys/class/net") if n != "lo")
    run(["ip", "link", "set", "lo", "up"])
    run(["ip", "link", "set", nic, "up"])
    done = run(["udhcpc", "-i", nic, "-s", "/usr/share/udhcpc/default.script", "-q", "-n", "-t", "30", "-T", "2"])
    addr = run(["ip", "-4", "-o", "addr", "show", "dev", nic]).stdout.split()
    ip = addr[3] if len(addr) > 3 else "none"
    say(f"network: {nic} {ip} by DHCP (udhcpc rc {done.returncode})")
    router = Path("/run/router").read_text().strip() if os.path.exists("/run/router") else ""
    if router:  # the host learns our MAC from this ARP exchange (libvirt's ARP address source)
        run(["arping", "-c", "2", "-I", nic, router])


def write_files(config):
    for entry in config.get("write_files") or []:
        path = entry["path"]
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as out:
            out.write(entry.get("content", ""))
        os.chmod(path, int(str(entry.get("permissions", "0644")), 8))
        say(f"wrote {path}")
    with open("/etc/fstab", "a") as fstab:
        for mount in config.get("mounts") or []:
            fields = ([str(f) for f in mount] + ["defaults", "0", "0"][len(mount) - 3:])[:6]
            fstab.write(" ".join(fields[:6]) + "\n")
            os.makedirs(fields[1], exist_ok=True)


def parse_unit(path):
    sections, current = {}, None
    for raw in Path(path).read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


class Units:
    def __init__(self):
        self.state = {}  # unit -> "active" | "failed"
        self.running = {}  # unit -> (Popen, unit sections)

    def start(self, unit):
        path = f"/etc/systemd/system/{unit}"
        if not os.path.exists(path):
            say(f"{unit}: not in this image, skipped")
            return
        sections = parse_unit(path)
        for need in " ".join(sections.get("Unit", {}).get("Requires", [])).split():
            if self.state.get(need) != "active":
                say(f"{unit}: Requires={need}, which is {self.state.get(need, 'not started')}: not started")
                self.state[unit] = "failed"
                return
        service = sections.get("Service", {})
        if service.get("Type", ["simple"])[-1] == "oneshot":
            rc = self.spawn(unit, service).wait()
            self.state[unit] = "active" if rc == 0 else "failed"
            say(f"{unit}: oneshot exited {rc} ({self.state[unit]})")
            return
        for attempt in range(60):  # ExecStartPre= checks, retried like Restart=on-failure without a limit
            failed = [pre for pre in service.get("ExecStartPre", [])
                      if subprocess.run(shlex.split(pre.lstrip("-"))).returncode != 0 and not pre.startswith("-")]
            if not failed:
                break
            say(f"{unit}: ExecStartPre {failed[0]} failed (try {attempt + 1}); retrying")
            time.sleep(float(service.get("RestartSec", ["5"])[-1]))
        self.running[unit] = (self.spawn(unit, service), service)
        self.state[unit] = "active"
        say(f"{unit}: started pid {self.running[unit][0].pid}")

    def spawn(self, unit, service):
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "LANG": "C.UTF-8"}
        for assignment in service.get("Environment", []):
            for word in shlex.split(assignment):
                key, _, value = word.partition("=")
                env[key] = value
        argv = shlex.split(service["ExecStart"][-1])
        user = service.get("User", ["root"])[-1]
        entry = pwd.getpwnam(user)
        os.makedirs(env.get("HOME", "/"), exist_ok=True)
        os.chown(env.get("HOME", "/"), entry.pw_uid, entry.pw_gid)
        say(f"{unit}: exec as {user}: {' '.join(argv)}")
        # systemd's defaults: stdout to the journal, stderr wherever stdout goes.
        out = service.get("StandardOutput", ["journal"])[-1]
        err = service.get("StandardError", ["inherit"])[-1]
        with open(self.sink(unit, out), "a") as out_log, open(self.sink(unit, out if err == "inherit" else err),
                                                             "a") as err_log:
            return subprocess.Popen(argv, env=env, user=entry.pw_uid, group=entry.pw_gid, extra_groups=[],
                                    stdout=out_log, stderr=err_log)  # the child keeps its own descriptors

    @staticmethod
    def sink(unit, value):
        if "console" in value or value == "tty":
            return "/dev/console"
        os.makedirs("/var/log/journal", exist_ok=True)
        return f"/var/log/journal/{unit}.log"

    def supervise(self):
        """Reap every child (we are PID 1) and restart failed simple units (Restart=on-failure)."""
        while True:
            try:
                pid, status = os.wait()
            except ChildProcessError:
                time.sleep(1)
                continue
            for unit, (proc, service) in list(self.running.items()):
                if proc.pid != pid:
                    continue
                code = os.waitstatus_to_exitcode(status)
                say(f"{unit}: exited {code}")
                if code != 0 and service.get("Restart", ["no"])[-1] in ("on-failure", "always"):
                    time.sleep(float(service.get("RestartSec", ["5"])[-1]))
                    self.running[unit] = (self.spawn(unit, service), service)


def report_models():
    mounts = [line.split() for line in Path("/proc/mounts").read_text().splitlines() if " /models " in line]
    if not mounts:
        say("/models: not mounted")
        return
    _dev, _dir, fstype, options = mounts[-1][:4]
    try:
        open("/models/.write-probe", "w").close()
        writable = "writable"
    except OSError as exc:
        writable = f"write refused ({exc.strerror})"
    say(f"/models: {fstype} {options.split(',')[0]} {writable}; entries {sorted(os.listdir('/models'))}")


def main():
    mount_basics()
    say("init started")
    meta, config = read_seed()
    hostname = config.get("hostname") or meta.get("local-hostname") or "guest"
    run(["hostname", hostname])
    say(f"seed read: instance {meta.get('instance-id')}, hostname {hostname}")
    network_up()
    write_files(config)
    units = Units()
    for command in config.get("runcmd") or []:
        argv = command if isinstance(command, list) else shlex.split(command)
        if argv[:1] == ["systemctl"]:
            if "--now" in argv:
                units.start(argv[-1])
            continue  # daemon-reload / enable without --now: nothing to do without systemd
        run(argv)
    report_models()
    say("seed applied")
    units.supervise()


if __name__ == "__main__":
    try:
        main()
    except BaseException as exc:  # noqa: BLE001 - PID 1 must not exit: the kernel would panic, hiding why
        say(f"FAILED: {exc!r}")
        while True:
            time.sleep(3600)
    sys.exit(0)
