#!/usr/bin/env bash
# Runs INSIDE the image being baked (virt-customize --run-command), never on the host.
# Installs the NVIDIA driver built for the guest's own kernel, CUDA, vLLM in /opt/vllm,
# the qemu guest agent, and the vllm user. Parameters come from the environment:
#   FABRIC_NVIDIA_DRIVER (e.g. 550), FABRIC_CUDA (e.g. 12-4), FABRIC_VLLM_VERSION (e.g. 0.6.3, or "latest")
# No credentials are used or written: everything comes from public package repositories.
set -euo pipefail

: "${FABRIC_NVIDIA_DRIVER:?}" "${FABRIC_CUDA:?}" "${FABRIC_VLLM_VERSION:?}"
export DEBIAN_FRONTEND=noninteractive

# The appliance runs its own kernel, so `uname -r` is wrong here: build for every kernel
# the image has installed (an Ubuntu cloud image has one).
mapfile -t kernels < <(ls /lib/modules)
if [ "${#kernels[@]}" -eq 0 ]; then
  echo "install-guest: no kernel in /lib/modules of the image" >&2
  exit 1
fi

apt-get update
apt-get install -y --no-install-recommends \
  qemu-guest-agent python3-venv python3-dev build-essential dkms ca-certificates curl gnupg
for k in "${kernels[@]}"; do
  apt-get install -y --no-install-recommends "linux-headers-${k}"
done

# NVIDIA's CUDA repository for this Ubuntu release (it also carries the server drivers).
# shellcheck source=/dev/null
. /etc/os-release
repo="ubuntu${VERSION_ID//./}"
curl -fsSL -o /tmp/cuda-keyring.deb \
  "https://developer.download.nvidia.com/compute/cuda/repos/${repo}/x86_64/cuda-keyring_1.1-1_all.deb"
dpkg -i /tmp/cuda-keyring.deb
rm -f /tmp/cuda-keyring.deb
apt-get update
apt-get install -y --no-install-recommends \
  "nvidia-driver-${FABRIC_NVIDIA_DRIVER}-server" "cuda-toolkit-${FABRIC_CUDA}"
for k in "${kernels[@]}"; do
  dkms autoinstall -k "${k}"
  # Prove the module exists for the guest kernel, not just for the appliance.
  find "/lib/modules/${k}" -name 'nvidia.ko*' | grep -q . || { echo "no nvidia module for ${k}" >&2; exit 1; }
done

id vllm >/dev/null 2>&1 || useradd --system --home-dir /var/lib/vllm --create-home --shell /usr/sbin/nologin vllm
python3 -m venv /opt/vllm
/opt/vllm/bin/pip install --no-cache-dir --upgrade pip
if [ "${FABRIC_VLLM_VERSION}" = "latest" ]; then
  /opt/vllm/bin/pip install --no-cache-dir vllm
else
  /opt/vllm/bin/pip install --no-cache-dir "vllm==${FABRIC_VLLM_VERSION}"
fi
/opt/vllm/bin/vllm serve --help >/dev/null

mkdir -p /models
systemctl enable qemu-guest-agent.service
apt-get clean
rm -rf /var/lib/apt/lists/*
