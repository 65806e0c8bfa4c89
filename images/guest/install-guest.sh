#!/usr/bin/env bash
# Runs INSIDE the image being baked (virt-customize --run-command), never on the host.
# Installs the NVIDIA driver built for the guest's own kernel, CUDA, one inference runtime
# (common/runtimes.py paths), the qemu guest agent, and the runtime's service user.
# Parameters come from the environment:
#   FABRIC_NVIDIA_DRIVER (e.g. 550), FABRIC_CUDA (e.g. 12-4),
#   FABRIC_RUNTIME (vllm, tensorrt-llm, triton, llama.cpp, tei; default vllm),
#   FABRIC_RUNTIME_VERSION (e.g. 0.6.3, a llama.cpp tag such as b4500, or "latest");
#   FABRIC_VLLM_VERSION is still read when FABRIC_RUNTIME_VERSION is unset.
# Triton and TEI are not installed here: the bake script uploaded their prebuilt tree first,
# and this script only checks that the binary runs.
# No credentials are used or written: everything comes from public package repositories.
set -euo pipefail

FABRIC_RUNTIME=${FABRIC_RUNTIME:-vllm}
FABRIC_RUNTIME_VERSION=${FABRIC_RUNTIME_VERSION:-${FABRIC_VLLM_VERSION:-latest}}
: "${FABRIC_NVIDIA_DRIVER:?}" "${FABRIC_CUDA:?}"
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

service_user() {
  id "$1" >/dev/null 2>&1 || useradd --system --home-dir "/var/lib/$1" --create-home --shell /usr/sbin/nologin "$1"
}

pip_runtime() {  # VENV PACKAGE [extra pip args...]
  local venv=$1 package=$2
  shift 2
  python3 -m venv "${venv}"
  "${venv}/bin/pip" install --no-cache-dir --upgrade pip
  if [ "${FABRIC_RUNTIME_VERSION}" = "latest" ]; then
    "${venv}/bin/pip" install --no-cache-dir "$@" "${package}"
  else
    "${venv}/bin/pip" install --no-cache-dir "$@" "${package}==${FABRIC_RUNTIME_VERSION}"
  fi
}

case "${FABRIC_RUNTIME}" in
  vllm)
    service_user vllm
    pip_runtime /opt/vllm vllm
    /opt/vllm/bin/vllm serve --help >/dev/null
    ;;
  tensorrt-llm)
    service_user fabric
    apt-get install -y --no-install-recommends libopenmpi-dev
    pip_runtime /opt/trtllm tensorrt_llm --extra-index-url https://pypi.nvidia.com
    /opt/trtllm/bin/trtllm-serve --help >/dev/null
    ;;
  llama.cpp)
    service_user fabric
    apt-get install -y --no-install-recommends git cmake
    ref=()
    [ "${FABRIC_RUNTIME_VERSION}" = "latest" ] || ref=(--branch "${FABRIC_RUNTIME_VERSION}")
    git clone --depth 1 "${ref[@]}" https://github.com/ggml-org/llama.cpp /tmp/llama.cpp
    cmake -S /tmp/llama.cpp -B /tmp/llama.cpp/build -DGGML_CUDA=ON -DLLAMA_CURL=OFF \
      -DCMAKE_CUDA_COMPILER="/usr/local/cuda/bin/nvcc" -DCMAKE_INSTALL_PREFIX=/opt/llama.cpp
    cmake --build /tmp/llama.cpp/build --config Release -j "$(nproc)" --target llama-server
    install -D -m 0755 /tmp/llama.cpp/build/bin/llama-server /opt/llama.cpp/bin/llama-server
    rm -rf /tmp/llama.cpp
    # No GPU while baking, and llama-server loads CUDA at start: only its presence is checked.
    test -x /opt/llama.cpp/bin/llama-server
    ;;
  triton)
    service_user fabric
    test -x /opt/tritonserver/bin/tritonserver || { echo "install-guest: /opt/tritonserver/bin/tritonserver missing" >&2; exit 1; }
    ;;
  tei)
    service_user fabric
    test -x /opt/tei/bin/text-embeddings-router || { echo "install-guest: /opt/tei/bin/text-embeddings-router missing" >&2; exit 1; }
    /opt/tei/bin/text-embeddings-router --help >/dev/null
    ;;
  *)
    echo "install-guest: unknown runtime ${FABRIC_RUNTIME}" >&2
    exit 1
    ;;
esac

mkdir -p /models
systemctl enable qemu-guest-agent.service
apt-get clean
rm -rf /var/lib/apt/lists/*
