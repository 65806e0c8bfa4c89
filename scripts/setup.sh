#!/usr/bin/env bash
# One-command setup on a bare Debian 12 machine as root. Idempotent: a second run checks
# and returns in seconds. Installs the Debian packages Fabric needs, the kernel-header links
# BCC needs, and a .venv (that also sees BCC) with the project installed editable.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  python3 python3-venv python3-dev python3-bpfcc bpfcc-tools bpftool
  linux-headers-amd64 etcd-server libvirt-dev pkg-config gcc
  iproute2 iputils-ping curl ca-certificates nginx-light shellcheck procps ethtool iperf3
  qemu-utils chromium prometheus
  bird2  # VIP announcements over BGP (agent/bgp/) and the two-node lab's router
  libvirt-daemon-system libvirt-daemon-driver-qemu qemu-system-x86 ovmf
  # the GPU-less boot proof's guest (lab/rigs/tiny_guest.py): kernel, busybox, DHCP on libvirt's network
  linux-image-amd64 busybox-static dnsmasq-base cpio
  systemd  # systemd-analyze verify/security and systemd-sysusers check images/host/ (tests/test_systemd_units.py)
  cloud-guest-utils gdisk fdisk  # growpart, sgdisk, sfdisk: the bake's root growth (tests/agent/test_guest_install.py)
  mmdebstrap systemd-container slirp4netns  # a fresh Debian 12 system container, online through slirp, runs scripts/install-host (scripts/test-install)
)

say() { printf '[setup] %s\n' "$*"; }

need_apt=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || need_apt+=("$p")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  say "installing Debian packages: ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
else
  say "Debian packages present"
fi

# BCC compiles against /lib/modules/$(uname -r)/build. A kernel without its own headers
# package (a VM's custom kernel) gets links to Debian's -amd64 (build) and -common (source).
kdir="/lib/modules/$(uname -r)"
if [ ! -e "$kdir/build" ]; then
  amd64=$(find /usr/src -maxdepth 1 -name 'linux-headers-*-amd64' | sort -V | tail -n1)
  common=$(find /usr/src -maxdepth 1 -name 'linux-headers-*-common' | sort -V | tail -n1)
  if [ -n "$amd64" ] && [ -n "$common" ]; then
    say "linking $kdir/build -> $amd64 and source -> $common"
    mkdir -p "$kdir"
    ln -sfn "$amd64" "$kdir/build"
    ln -sfn "$common" "$kdir/source"
  else
    say "WARNING: no kernel headers found under /usr/src; BPF tests will be skipped"
  fi
fi

# The QEMU driver for the libvirt tests (real define-time validation, and the boot test).
# Debian 12 has no separate virtiofsd package: QEMU 7.2 ships its C daemon as
# /usr/lib/qemu/virtiofsd. Without systemd (a container-like VM) nothing starts libvirtd.
scripts/libvirtd-up.sh

mountpoint -q /sys/fs/bpf 2>/dev/null || mount -t bpf bpf /sys/fs/bpf 2>/dev/null || true

# The venv uses Debian's python3.11 so that python3-bpfcc (built for it) imports.
PY=/usr/bin/python3.11
[ -x "$PY" ] || PY=python3
stamp=.venv/.fabric-installed
if [ ! -x .venv/bin/python ]; then
  say "creating .venv (sees Debian's BCC through system site-packages)"
  "$PY" -m venv --system-site-packages .venv
fi
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ scripts/constraints.txt -nt "$stamp" ]; then
  say "installing the project into .venv"
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  .venv/bin/python -m pip install -q -c scripts/constraints.txt -e '.[dev]'  # pinned: scripts/constraints.txt
  touch "$stamp"
else
  say ".venv up to date"
fi
if .venv/bin/python -c "import bcc" 2>/dev/null; then say "BCC importable"; else say "WARNING: BCC not importable"; fi
scripts/setup-engine.sh  # the real vLLM engine for the lab, in its own .venv-engine (FABRIC_SKIP_ENGINE=1 skips)

# The console's htmx: npm's htmx.org at the version and integrity hash of package-lock.json,
# copied to the path fabricd serves (/app/ai/static; gitignored). Nothing loads from outside at run time.
static=controlplane/console/static
if [ ! -f "$static/htmx.min.js" ] || [ package-lock.json -nt "$static/htmx.min.js" ]; then
  if ! command -v npm >/dev/null; then
    say "installing Debian's npm"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends npm >/dev/null
  fi
  say "installing the console's htmx (npm ci)"
  npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >/dev/null
  cp node_modules/htmx.org/dist/htmx.min.js "$static/htmx.min.js"
  cp node_modules/htmx.org/LICENSE "$static/htmx-LICENSE.txt"
else
  say "console htmx present"
fi
say "done"
