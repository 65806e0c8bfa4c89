#!/usr/bin/env bash
# Make qemu:///system answer: with systemd, start libvirtd's socket units; without it
# (a container or a bare VM whose PID 1 is something else), start virtlogd and libvirtd
# as daemons. Idempotent: returns at once when libvirt already answers. Used by
# scripts/setup.sh and by the tests that need the QEMU driver (after a reboot nothing
# restarts daemons on a machine without systemd).
set -euo pipefail

answers() { virsh -q -c qemu:///system uri >/dev/null 2>&1; }

# Run a command with every descriptor above stderr closed.
without_inherited_fds() {
  (
    for fd in /proc/"$BASHPID"/fd/*; do
      fd=${fd##*/}
      [ "$fd" -gt 2 ] && eval "exec $fd>&-"
    done
    exec "$@"
  )
}

# Without udev /dev/kvm stays root:root 0600, so QEMU (run as libvirt-qemu, group kvm) cannot
# use it; libvirt then re-probes QEMU's capabilities on every define (minutes under load).
# Give it the owner and mode udev's rule gives it.
if [ -c /dev/kvm ] && getent group kvm >/dev/null && [ "$(stat -c %G /dev/kvm)" != kvm ]; then
  chown root:kvm /dev/kvm && chmod g+rw /dev/kvm
fi

command -v libvirtd >/dev/null || { echo "libvirtd-up: libvirtd is not installed (scripts/setup.sh)" >&2; exit 1; }
answers && exit 0
if [ "$(cat /proc/1/comm 2>/dev/null)" = "systemd" ]; then
  systemctl start virtlogd.socket libvirtd.socket libvirtd.service
else
  # The daemons outlive this script: they must not keep the caller's descriptors. A caller
  # under `flock /tmp/fabric-lab.lock make run` would otherwise leave the lab lock held by
  # libvirtd for good, and every later lab user (the tests included) waits on it forever.
  pgrep -x virtlogd >/dev/null || without_inherited_fds virtlogd -d
  pgrep -x libvirtd >/dev/null || without_inherited_fds libvirtd -d
fi
for _ in $(seq 1 60); do
  answers && exit 0
  sleep 0.5
done
echo "libvirtd-up: libvirtd started but qemu:///system does not answer (see /var/log/libvirt/libvirtd.log)" >&2
exit 1
