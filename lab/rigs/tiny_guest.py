"""A tiny guest for the GPU-less VM boot proof, built from this host's installed files (no download).

- kernel: Debian's `linux-image-amd64` (/boot/vmlinuz-*-amd64; scripts/setup.sh installs it). The
  generic flavour, not -cloud: the cloud kernel has no AHCI, and our seed is a SATA cdrom.
- initramfs (gzip newc cpio, written here): busybox-static, the kernel modules the domain's
  devices need with their dependencies (from modules.dep, loaded in order), and an /init that
  mounts the root disk and switch_roots to /sbin/fabric-guest-init.
- root filesystem (ext4 made with `mkfs.ext4 -d`, converted to the qcow2 golden image):
  busybox, the host's python3 with its stdlib and the shared libraries it and its extension
  modules link, exactly the third-party packages the engine simulator imports (found by
  importing them in the project's venv) in /usr/lib/python3/dist-packages, the repo's `enginesim` and `common` packages,
  /opt/vllm/bin/vllm (the runtime table's vLLM path) turning `vllm serve MODEL
  --served-model-name N --host H --port P` into the simulator, a `vllm` user, and the init
  (lab/rigs/tiny_guest_init.py) that applies our cloud-init seed.

The golden image goes through the driver like a baked one: the driver puts a qcow2 overlay on it.
"""

from __future__ import annotations

import glob
import gzip
import io
import os
import re
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# What the domain's devices need: virtio-pci disk and NIC, the virtiofs share, the SATA cdrom, and
# ext4 for the root (crc32c first: ext4's metadata checksums ask the crypto API for it, and there is
# no modprobe in the initramfs to load it on demand).
MODULES = ("crc32c_generic", "ext4", "virtio_pci", "virtio_blk", "virtio_net", "virtiofs", "ahci", "sr_mod", "isofs")
CMDLINE = "console=ttyS0 root=/dev/vda rw panic=-1 quiet loglevel=4"
# Imported in the venv to learn which packages the simulator needs (uvicorn loads some lazily).
SIM_IMPORTS = ("enginesim.cli", "enginesim.server", "enginesim.app", "yaml",
               "uvicorn.loops.auto", "uvicorn.loops.asyncio", "uvicorn.protocols.http.auto",
               "uvicorn.protocols.http.h11_impl", "uvicorn.protocols.websockets.auto", "uvicorn.lifespan.on")
STDLIB_SKIP = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "site-packages",
               "dist-packages", "config-3.11-x86_64-linux-gnu", "pydoc_data"}

VLLM_SHIM = """#!/usr/bin/python3
# The guest's "vLLM": the runtime table's vllm command line, served by the engine simulator.
import argparse, os, socket, sys
p = argparse.ArgumentParser(prog="vllm")
p.add_argument("command", choices=["serve"])
p.add_argument("model")
p.add_argument("--served-model-name")
p.add_argument("--host", default="0.0.0.0")
p.add_argument("--port", default="8000")
p.add_argument("--max-model-len")
args, _ignored = p.parse_known_args()  # --tensor-parallel-size etc.: no GPUs to split over
argv = [sys.executable, "-m", "enginesim", "--model", args.served_model_name or args.model,
        "--host", args.host, "--port", args.port, "--replica-id", socket.gethostname()]
if args.max_model_len:
    argv += ["--max-model-len", args.max_model_len]
print("vllm (engine simulator): serving", args.model, flush=True)
os.execv(sys.executable, argv)
"""

# Debian's busybox has no mountpoint applet (util-linux provides it); the seed's mount unit uses `-q`.
MOUNTPOINT = """#!/bin/sh
[ "$1" = -q ] && shift
grep -q " $(cd "$1" 2>/dev/null && pwd -P) " /proc/mounts
"""

UDHCPC_SCRIPT = """#!/bin/sh
# busybox udhcpc hook: apply the lease (cloud-init's default network config is DHCP on the first NIC).
case "$1" in
  deconfig) ip -4 addr flush dev "$interface"; ip link set "$interface" up ;;
  bound|renew)
    ip -4 addr flush dev "$interface"
    ip addr add "$ip/${mask:-24}" dev "$interface"
    for r in $router; do ip route add default via "$r" dev "$interface" 2>/dev/null; break; done
    # libvirt's isolated networks hand out no router: the DHCP server is the host then.
    echo "${router%% *}" | grep -q . && echo "${router%% *}" > /run/router || echo "$serverid" > /run/router ;;
esac
exit 0
"""

INIT = """#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sysfs /sys; mount -t devtmpfs devtmpfs /dev
echo "tiny-initramfs: loading modules at $(cut -d' ' -f1 /proc/uptime)s" > /dev/console
for m in $(cat /modules.order); do insmod "/modules/$m" 2>/dev/console || echo "insmod $m failed" > /dev/console; done
for i in $(seq 1 200); do [ -b /dev/vda ] && break; sleep 0.1; done
mkdir -p /newroot
mount -t ext4 /dev/vda /newroot || { echo "tiny-initramfs: cannot mount /dev/vda" > /dev/console; sleep 3600; }
for d in proc sys dev; do mkdir -p /newroot/$d; mount --move /$d /newroot/$d; done
echo "tiny-initramfs: switch_root at $(cut -d' ' -f1 /newroot/proc/uptime)s" > /newroot/dev/console
exec switch_root /newroot /sbin/fabric-guest-init
"""


@dataclass(frozen=True)
class TinyGuest:
    kernel: Path
    initrd: Path
    golden: Path
    cmdline: str = CMDLINE


def find_kernel() -> tuple[Path, Path]:
    """(vmlinuz, its /lib/modules dir) of the newest generic Debian kernel installed."""
    found = sorted(Path(p) for p in glob.glob("/boot/vmlinuz-*-amd64") if "-cloud-" not in p)
    for kernel in reversed(found):
        modules = Path("/lib/modules") / kernel.name.removeprefix("vmlinuz-")
        if (modules / "modules.dep").exists():
            return kernel, modules
    raise FileNotFoundError("no Debian kernel with modules in /boot (scripts/setup.sh installs linux-image-amd64)")


def module_order(modules_dir: Path, names: tuple[str, ...] = MODULES) -> list[str]:
    """Module files (relative to modules_dir) for `names`, dependencies first; built-ins skipped."""
    deps: dict[str, list[str]] = {}
    for line in (modules_dir / "modules.dep").read_text().splitlines():
        target, _, rest = line.partition(":")
        deps[target] = rest.split()
    by_name = {Path(t).name.split(".ko")[0].replace("-", "_"): t for t in deps}
    builtin = {Path(t).name.split(".ko")[0].replace("-", "_")
               for t in (modules_dir / "modules.builtin").read_text().split()}
    order: list[str] = []

    def add(target: str) -> None:
        for dep in reversed(deps[target]):  # modules.dep lists the deepest dependency last
            add(dep)
        if target not in order:
            order.append(target)

    for name in names:
        if name in builtin:
            continue
        if name not in by_name:
            raise FileNotFoundError(f"kernel module {name} not in {modules_dir}")
        add(by_name[name])
    return order


def write_cpio(target: Path, files: dict[str, tuple[int, bytes]]) -> None:
    """A gzip newc archive; `files` maps path -> (mode, content); symlinks carry S_IFLNK and their target."""
    out = io.BytesIO()
    for ino, (name, (mode, data)) in enumerate(sorted(files.items()) + [("TRAILER!!!", (0, b""))], 1):
        encoded = name.encode() + b"\0"
        fields = (ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(encoded), 0)
        out.write(b"070701" + b"".join(b"%08X" % f for f in fields) + encoded)
        out.write(b"\0" * (-(110 + len(encoded)) % 4) + data + b"\0" * (-len(data) % 4))
    target.write_bytes(gzip.compress(out.getvalue(), compresslevel=1))


def build_initramfs(target: Path, modules_dir: Path) -> None:
    busybox = Path("/bin/busybox").read_bytes()
    files: dict[str, tuple[int, bytes]] = {}
    for d in ("bin", "dev", "proc", "sys", "modules", "newroot"):
        files[d] = (stat.S_IFDIR | 0o755, b"")
    files["bin/busybox"] = (stat.S_IFREG | 0o755, busybox)
    files["bin/sh"] = (stat.S_IFLNK | 0o777, b"busybox")
    files["init"] = (stat.S_IFREG | 0o755, INIT.encode())
    order = module_order(modules_dir)
    for rel in order:
        files[f"modules/{Path(rel).name}"] = (stat.S_IFREG | 0o644, (modules_dir / rel).read_bytes())
    files["modules.order"] = (stat.S_IFREG | 0o644, "\n".join(Path(r).name for r in order).encode() + b"\n")
    write_cpio(target, files)


def sim_packages(venv_python: Path) -> list[Path]:
    """Top-level package dirs/files outside the stdlib that the simulator imports, per the venv."""
    code = ("import importlib, sys, sysconfig\n"
            f"for m in {SIM_IMPORTS!r}: importlib.import_module(m)\n"
            "std = sysconfig.get_paths()['stdlib']\n"
            "for name, mod in list(sys.modules.items()):\n"
            "    f = getattr(mod, '__file__', None)\n"
            "    if f and '.' not in name and not f.startswith(std + '/'):\n"
            "        print(name, f)\n")
    done = subprocess.run([str(venv_python), "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    roots = set()
    for line in done.stdout.splitlines():
        name, path = line.split(" ", 1)
        if name in ("enginesim", "common", "_distutils_hack") or name.startswith("__editable__"):
            continue  # the repo's packages are copied from the repo; the others are venv hooks
        p = Path(path)
        roots.add(p.parent if p.name == "__init__.py" else p)
    return sorted(roots)


def _copy_lib_closure(paths: list[Path], root: Path) -> None:
    """Copy every shared library `paths` link (ldd) into root at the same absolute path."""
    libs: set[str] = set()
    for p in paths:
        done = subprocess.run(["ldd", str(p)], capture_output=True, text=True, check=False)
        for match in re.finditer(r"(/\S+\.so[.\d]*)", done.stdout):
            libs.add(match.group(1))
    for lib in libs:
        real = Path(lib)
        dest = root / lib.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        if not dest.exists():
            shutil.copy2(real.resolve(), dest)


def build_rootfs(root: Path, venv_python: Path) -> None:
    py = Path(os.path.realpath("/usr/bin/python3"))
    stdlib = Path(f"/usr/lib/python3.{sys.version_info.minor}")
    for d in ("bin", "sbin", "etc", "proc", "sys", "dev", "run", "tmp", "models", "var/lib", "usr/bin",
              "usr/share/udhcpc", "opt/vllm/bin"):
        (root / d).mkdir(parents=True, exist_ok=True)
    shutil.copy2("/bin/busybox", root / "bin/busybox")
    applets = subprocess.run(["/bin/busybox", "--list"], capture_output=True, text=True, check=True).stdout.split()
    for applet in applets:
        if not (root / "bin" / applet).exists():
            (root / "bin" / applet).symlink_to("busybox")
    shutil.copy2(py, root / "usr/bin" / py.name)
    (root / "usr/bin/python3").symlink_to(py.name)
    shutil.copytree(stdlib, root / stdlib.relative_to("/"), symlinks=True,
                    ignore=lambda _d, names: [n for n in names if n in STDLIB_SKIP])
    site = root / "usr/lib/python3/dist-packages"  # on Debian python's sys.path
    site.mkdir(parents=True)
    for pkg in sim_packages(venv_python):
        if pkg.is_dir():
            shutil.copytree(pkg, site / pkg.name, ignore=shutil.ignore_patterns("tests"))
        else:
            shutil.copy2(pkg, site / pkg.name)
    shutil.copytree(REPO / "enginesim", site / "enginesim", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "common", site / "common", ignore=shutil.ignore_patterns("__pycache__"))
    # Byte-compile here: the engine runs as `vllm` and cannot write __pycache__ into root's dirs, so
    # without .pyc files every start would compile every module again, which under TCG takes minutes.
    subprocess.run([str(py), "-m", "compileall", "-q", "-j", "0", str(site), str(root / stdlib.relative_to("/"))],
                   check=True, capture_output=True)
    binaries = [py, *root.rglob("*.so")]
    _copy_lib_closure(binaries, root)
    (root / "opt/vllm/bin/vllm").write_text(VLLM_SHIM)
    (root / "opt/vllm/bin/vllm").chmod(0o755)
    (root / "bin/mountpoint").unlink(missing_ok=True)
    (root / "bin/mountpoint").write_text(MOUNTPOINT)
    (root / "bin/mountpoint").chmod(0o755)
    (root / "usr/bin/mountpoint").symlink_to("/bin/mountpoint")  # where Ubuntu has it (the engine unit's path)
    (root / "usr/share/udhcpc/default.script").write_text(UDHCPC_SCRIPT)
    (root / "usr/share/udhcpc/default.script").chmod(0o755)
    shutil.copy2(REPO / "lab/rigs/tiny_guest_init.py", root / "sbin/fabric-guest-init")
    init = root / "sbin/fabric-guest-init"
    init.write_text("#!/usr/bin/python3\n" + init.read_text())
    init.chmod(0o755)
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\nvllm:x:999:999:vllm:/var/lib/vllm:/bin/false\n")
    (root / "etc/group").write_text("root:x:0:\nvllm:x:999:\n")
    (root / "etc/fstab").write_text("")
    (root / "var/lib/vllm").mkdir()
    os.chown(root / "var/lib/vllm", 999, 999)


def build(work: Path, venv_python: Path = REPO / ".venv/bin/python", size_mib: int = 768) -> TinyGuest:
    """Kernel (host's), initramfs and golden qcow2 under `work`."""
    kernel, modules_dir = find_kernel()
    work.mkdir(parents=True, exist_ok=True)
    # QEMU runs as libvirt-qemu: it reads the kernel from our directory, never from /boot (0600 there).
    shutil.copy2(kernel, work / "vmlinuz")
    (work / "vmlinuz").chmod(0o644)
    build_initramfs(work / "initrd.img", modules_dir)
    root = work / "rootfs"
    build_rootfs(root, venv_python)
    raw = work / "root.ext4"
    subprocess.run(["mkfs.ext4", "-q", "-F", "-L", "fabric-root", "-d", str(root), str(raw), f"{size_mib}M"],
                   check=True, capture_output=True)
    golden = work / "golden.qcow2"
    subprocess.run(["qemu-img", "convert", "-q", "-f", "raw", "-O", "qcow2", str(raw), str(golden)], check=True)
    raw.unlink()
    shutil.rmtree(root)
    return TinyGuest(work / "vmlinuz", work / "initrd.img", golden)
