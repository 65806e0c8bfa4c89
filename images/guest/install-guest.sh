#!/usr/bin/env bash
# Runs INSIDE the image being baked (virt-customize --run-command), never on the host.
# Installs the NVIDIA driver built for the guest's own kernel, CUDA, one inference runtime
# (common/runtimes.py paths), the qemu guest agent, and the runtime's service user.
# Parameters come from the environment (defaults in images/guest/versions.env):
#   FABRIC_NVIDIA_VERSION (exact, e.g. 580.82.07), FABRIC_CUDA (e.g. 13-0),
#   FABRIC_NVIDIA_OPEN=1 (open kernel modules), FABRIC_FABRIC_MANAGER=1 (fabric manager + NSCQ),
#   FABRIC_MIN_FREE_GIB (refuse to start with less free space on /),
#   FABRIC_RUNTIME (vllm, tensorrt-llm, triton, llama.cpp, tei; default vllm),
#   FABRIC_RUNTIME_VERSION (e.g. 0.32.0, a llama.cpp tag such as b4500, or "latest");
#   FABRIC_VLLM_VERSION is still read when FABRIC_RUNTIME_VERSION is unset;
#   FABRIC_ROOT_PARTITION (grown first: growpart + resize2fs, partition numbers kept);
#   FABRIC_CUDA "auto" picks FABRIC_CUDA_UBUNTU<release> (e.g. FABRIC_CUDA_UBUNTU2404) for the
#   image's Ubuntu release; FABRIC_CUDA_ARCHS (CUDA architectures llama.cpp is built for,
#   "80;86;89;90"); FABRIC_ENGINE_CHECKS (engine-args.json, uploaded by the bake: the command
#   lines and options Fabric's guest unit gives each runtime, checked against the installed engine:
#   vLLM's own argument parser (check-vllm-args.py beside it), the --help of the others).
# The functions are sourced by tests (tests/agent/test_guest_install.py) with stand-in tools;
# `main` runs only when the script is executed.
# Triton and TEI are not installed here: the bake script uploaded their prebuilt tree first,
# and this script only checks that the binary runs.
# No credentials are used or written: everything comes from public package repositories.
set -euo pipefail

# grow_root PARTITION: grow the partition to the end of its disk, then its ext4 filesystem.
# growpart (cloud-guest-utils, in every Ubuntu cloud image) keeps the partition's number and
# its neighbours, unlike virt-resize, which renumbers (the BIOS boot partition 14 included).
grow_root() {
  local part=$1 disk num
  num=${part##*[!0-9]}
  disk=${part%"${num}"}
  case "${disk}" in *[0-9]p) disk=${disk%p} ;; esac  # nvme0n1p1, loop0p1
  if [ -z "${num}" ] || [ ! -b "${disk}" ]; then
    echo "install-guest: cannot grow ${part}: no disk ${disk}" >&2
    return 1
  fi
  grow_partition "${disk}" "${num}"
  resize2fs "${part}"
}

# grow_partition DISK NUMBER: growpart, where exit 1 means nothing to grow (NOCHANGE).
grow_partition() {
  local rc=0
  growpart "$1" "$2" || rc=$?
  if [ "${rc}" -ne 0 ] && [ "${rc}" -ne 1 ]; then
    echo "install-guest: growpart $1 $2 failed (${rc})" >&2
    return 1
  fi
}

# cuda_package OS_RELEASE_FILE: the CUDA toolkit package for this Ubuntu release, checked to be
# in the repositories (cuda-toolkit-12-4 is not published for 24.04, whose support starts at 12.5).
cuda_package() {
  local os_release=$1 version_id cuda
  # shellcheck source=/dev/null disable=SC2153  # VERSION_ID comes from os-release
  version_id=$(. "${os_release}" && echo "${VERSION_ID}")
  cuda=${FABRIC_CUDA}
  if [ "${cuda}" = auto ]; then
    local var="FABRIC_CUDA_UBUNTU${version_id//./}"
    cuda=${!var:-}
    [ -n "${cuda}" ] || { echo "install-guest: no CUDA version for Ubuntu ${version_id} (set ${var} or --cuda)" >&2; return 1; }
  fi
  if ! apt-cache show "cuda-toolkit-${cuda}" >/dev/null 2>&1; then
    echo "install-guest: cuda-toolkit-${cuda} is not published for Ubuntu ${version_id} (pass --cuda with one that is)" >&2
    return 1
  fi
  echo "cuda-toolkit-${cuda}"
}

# install_llama_cpp SRC PREFIX: build llama-server with CUDA for FABRIC_CUDA_ARCHS (not the
# GPU-less appliance's "native" architectures), static, so the installed binary needs no
# libllama/libggml from the deleted build tree; prove it runs (--version) and links.
install_llama_cpp() {
  local src=$1 prefix=$2
  cmake -S "${src}" -B "${src}/build" -DGGML_CUDA=ON -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF \
    -DGGML_NATIVE=OFF -DCMAKE_CUDA_ARCHITECTURES="${FABRIC_CUDA_ARCHS:-80;86;89;90}" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc -DCMAKE_INSTALL_PREFIX="${prefix}"
  cmake --build "${src}/build" --config Release -j "$(nproc)" --target llama-server
  install -D -m 0755 "${src}/build/bin/llama-server" "${prefix}/bin/llama-server"
  if ldd "${prefix}/bin/llama-server" | grep -E 'not found|lib(llama|ggml)'; then
    echo "install-guest: llama-server links libraries the bake does not keep" >&2
    return 1
  fi
  "${prefix}/bin/llama-server" --version
}

# engine_options RUNTIME: the options Fabric's guest unit can give RUNTIME (common/runtimes.py
# Runtime.flags), one a line, from the bake's engine-args.json.
engine_options() {
  python3 -c 'import json, sys; print("\n".join(json.load(open(sys.argv[1]))["help_options"][sys.argv[2]]))' \
    "${FABRIC_ENGINE_CHECKS:-/tmp/engine-args.json}" "$1"
}

# check_options WHAT HELP_TEXT: every option engine_options lists for FABRIC_RUNTIME must be in
# the installed engine's --help (a word of its own there, as the engine's own listing writes it).
check_options() {
  local what=$1 help=$2 option
  while IFS= read -r option; do
    [ -n "${option}" ] || continue
    grep -Eq -- "(^|[[:space:],])${option}([^[:alnum:]_-]|\$)" <<<"${help}" ||
      { echo "install-guest: ${what} has no ${option} (Fabric's guest unit passes it)" >&2; return 1; }
  done < <(engine_options "${FABRIC_RUNTIME}")
}

# check_vllm_args PYTHON: every command line Fabric's guest unit can give vLLM, parsed by the
# installed vLLM's own argument parser (check-vllm-args.py); an unknown flag fails the bake.
check_vllm_args() {
  local checks=${FABRIC_ENGINE_CHECKS:-/tmp/engine-args.json}
  "$1" "$(dirname "${checks}")/check-vllm-args.py" "${checks}"
}

main() {
FABRIC_RUNTIME=${FABRIC_RUNTIME:-vllm}
FABRIC_RUNTIME_VERSION=${FABRIC_RUNTIME_VERSION:-${FABRIC_VLLM_VERSION:-latest}}
: "${FABRIC_NVIDIA_VERSION:?}" "${FABRIC_CUDA:?}"
FABRIC_NVIDIA_OPEN=${FABRIC_NVIDIA_OPEN:-0}
FABRIC_FABRIC_MANAGER=${FABRIC_FABRIC_MANAGER:-0}
BRANCH=${FABRIC_NVIDIA_VERSION%%.*}
export DEBIAN_FRONTEND=noninteractive

if [ -n "${FABRIC_ROOT_PARTITION:-}" ]; then
  grow_root "${FABRIC_ROOT_PARTITION}"
fi
# Make sure the grown root really has room.
free_gib=$(df --output=avail -BG / | tail -n1 | tr -dc 0-9)
if [ "${free_gib}" -lt "${FABRIC_MIN_FREE_GIB:-25}" ]; then
  echo "install-guest: only ${free_gib} GiB free on /, need ${FABRIC_MIN_FREE_GIB:-25} (was the root partition grown?)" >&2
  exit 1
fi

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

# apt wants the full Debian version; find the one whose upstream part is exactly ours.
pinned() {  # PACKAGE -> PACKAGE=FULL_VERSION, or fail naming what is missing
  local full
  full=$(apt-cache madison "$1" | awk -v v="${FABRIC_NVIDIA_VERSION}" '$3 ~ ("^" v "-") {print $3; exit}')
  [ -n "${full}" ] || { echo "install-guest: no $1 ${FABRIC_NVIDIA_VERSION} in the repositories" >&2; exit 1; }
  echo "$1=${full}"
}
driver="nvidia-driver-${BRANCH}-server"
[ "${FABRIC_NVIDIA_OPEN}" = 1 ] && driver="nvidia-driver-${BRANCH}-server-open"
packages=("$(pinned "${driver}")")
if [ "${FABRIC_FABRIC_MANAGER}" = 1 ]; then
  packages+=("$(pinned "nvidia-fabricmanager-${BRANCH}")" "$(pinned "libnvidia-nscq-${BRANCH}")")
fi
cuda=$(cuda_package /etc/os-release)
apt-get install -y --no-install-recommends "${packages[@]}" "${cuda}"
# Hold the driver and the kernel it was built for: an unattended kernel upgrade would boot a
# kernel without nvidia.ko. Upgrades are a new bake.
mapfile -t kernel_packages < <(dpkg-query -W -f='${Package}\n' 'linux-image-*' 'linux-headers-*' \
  'linux-modules-*' 'linux-generic*' 'linux-virtual*' 'linux-kvm*' 2>/dev/null | sort -u)
apt-mark hold "${packages[@]%%=*}" "${kernel_packages[@]}"
if [ "${FABRIC_FABRIC_MANAGER}" = 1 ]; then
  systemctl enable nvidia-fabricmanager.service
fi
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
    # Importing both proves the wheels match this Python and each other (serve --help did not).
    /opt/vllm/bin/python -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
    check_vllm_args /opt/vllm/bin/python
    ;;
  tensorrt-llm)
    service_user fabric
    apt-get install -y --no-install-recommends libopenmpi-dev
    pip_runtime /opt/trtllm tensorrt_llm --extra-index-url https://pypi.nvidia.com
    check_options "trtllm-serve ${FABRIC_RUNTIME_VERSION}" "$(/opt/trtllm/bin/trtllm-serve serve --help)"
    ;;
  llama.cpp)
    service_user fabric
    apt-get install -y --no-install-recommends git cmake
    ref=()
    [ "${FABRIC_RUNTIME_VERSION}" = "latest" ] || ref=(--branch "${FABRIC_RUNTIME_VERSION}")
    git clone --depth 1 "${ref[@]}" https://github.com/ggml-org/llama.cpp /tmp/llama.cpp
    install_llama_cpp /tmp/llama.cpp /opt/llama.cpp
    rm -rf /tmp/llama.cpp
    check_options "llama-server ${FABRIC_RUNTIME_VERSION}" "$(/opt/llama.cpp/bin/llama-server --help 2>&1)"
    ;;
  triton)
    service_user fabric
    test -x /opt/tritonserver/bin/tritonserver || { echo "install-guest: /opt/tritonserver/bin/tritonserver missing" >&2; exit 1; }
    ;;
  tei)
    service_user fabric
    test -x /opt/tei/bin/text-embeddings-router || { echo "install-guest: /opt/tei/bin/text-embeddings-router missing" >&2; exit 1; }
    check_options text-embeddings-router "$(/opt/tei/bin/text-embeddings-router --help)"
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
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  main "$@"
fi
