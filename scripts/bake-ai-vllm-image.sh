#!/usr/bin/env bash
# Bake Fabric's golden guest image from an Ubuntu cloud image, for one runtime (default vLLM).
#
#   scripts/bake-ai-vllm-image.sh [--dry-run] [--force] [--runtime NAME] [options] SRC.qcow2 DST.qcow2
#
# What each runtime gets (docs/runtimes.md): vllm and tensorrt-llm are pip-installed into
# /opt/vllm and /opt/trtllm; llama.cpp is built from source with CUDA into /opt/llama.cpp;
# triton and tei have no package this script can install, so --runtime-dir uploads a
# prebuilt tree (e.g. copied out of NVIDIA's or Hugging Face's container) to /opt/tritonserver
# or /opt/tei, and the guest script checks that its binary runs.
#
# Versions default to images/guest/versions.env (exact driver, CUDA by Ubuntu release, vLLM
# and TensorRT-LLM versions). SRC is copied into a new image of --size (qemu-img convert and
# resize), and inside the appliance growpart + resize2fs grow the root partition and its
# filesystem in place: partition numbers stay as the cloud image has them (virt-resize
# renumbers them, which breaks the BIOS boot partition). The guest kernel and the driver
# packages are held so unattended upgrades cannot leave the guest without nvidia.ko. The
# appliance gets --appliance-memory MiB and --appliance-cpus CPUs (llama.cpp's CUDA build needs
# several GiB).
#
# SRC is only read (qemu-img converts it into a new file); DST is written as DST.partial and renamed
# when every step succeeded, then DST.sha256 is written beside it. --dry-run prints every
# step and runs none of them (it needs neither virt-customize nor qemu-img).
# No credentials are used or stored: no Hugging Face token, no API key goes into the image.
set -euo pipefail

usage() {
  cat <<'USAGE'
usage: bake-ai-vllm-image.sh [--dry-run] [--force] [--size SIZE] [--nvidia-driver VER]
                             [--cuda VER] [--cuda-archs LIST] [--open-kernel-modules] [--fabric-manager]
                             [--runtime NAME] [--runtime-version VER]
                             [--runtime-dir DIR] SRC.qcow2 DST.qcow2
  Defaults come from images/guest/versions.env.
  --dry-run              print every step without running it
  --force                overwrite DST if it exists
  --size SIZE            the image's size; root partition and filesystem grow to fill it (default 60G)
  --nvidia-driver VER    exact NVIDIA driver version, e.g. 580.82.07 (branch = first field; default:
                         versions.env's FABRIC_NVIDIA_VERSION)
  --cuda VER             CUDA toolkit package version (e.g. 13-0; default: by the image's Ubuntu release)
  --cuda-archs LIST      CUDA architectures llama.cpp is built for, e.g. 89 or 80,90 (default:
                         versions.env's FABRIC_CUDA_ARCHS, 80;86;89;90)
  --appliance-memory MIB memory of the libguestfs appliance (default 8192; llama.cpp: 16384)
  --appliance-cpus N     its CPUs (default: this host's, at most 16)
  --open-kernel-modules  the open GPU kernel modules (nvidia-driver-BRANCH-server-open)
  --fabric-manager       nvidia-fabricmanager and libnvidia-nscq of the same version, enabled
                         (HGX boards: an 8-GPU VM with its NVSwitches needs them in the guest)
  --runtime NAME         vllm, tensorrt-llm, triton, llama.cpp or tei (default vllm)
  --runtime-version VER  the runtime's version (PyPI for vllm/tensorrt-llm, a git tag for
                         llama.cpp), or "latest" (default: vllm from versions.env, others latest)
  --vllm VERSION         same as --runtime vllm --runtime-version VERSION
  --runtime-dir DIR      triton/tei only (required): a prebuilt tree with bin/tritonserver
                         or bin/text-embeddings-router, uploaded to /opt/tritonserver or /opt/tei
USAGE
}

die() { echo "bake: $*" >&2; exit 1; }

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
IMAGES="${FABRIC_IMAGES_DIR:-$(dirname "${HERE}")/images}"
[ -f "${IMAGES}/guest/versions.env" ] || die "missing ${IMAGES}/guest/versions.env"
# shellcheck source=/dev/null
. "${IMAGES}/guest/versions.env"

DRY_RUN=0
FORCE=0
SIZE=60G
NVIDIA_DRIVER=
CUDA=${FABRIC_CUDA}
CUDA_ARCHS=${FABRIC_CUDA_ARCHS}
OPEN_MODULES=0
FABRIC_MANAGER=0
RUNTIME=vllm
RUNTIME_VERSION=
RUNTIME_DIR=
APPLIANCE_MEMORY=
APPLIANCE_CPUS=
POSITIONAL=()
while [ "$#" -gt 0 ]; do
  case "$1" in
    --dry-run) DRY_RUN=1 ;;
    --force) FORCE=1 ;;
    --size) [ "$#" -ge 2 ] || { usage >&2; exit 2; }; SIZE=$2; shift ;;
    --nvidia-driver) [ "$#" -ge 2 ] || { usage >&2; exit 2; }; NVIDIA_DRIVER=$2; shift ;;
    --cuda) [ "$#" -ge 2 ] || { usage >&2; exit 2; }; CUDA=$2; shift ;;
    --cuda-archs) [ "$#" -ge 2 ] || { usage >&2; exit 2; }; CUDA_ARCHS=$2; shift ;;
    --open-kernel-modules) OPEN_MODULES=1 ;;
    --fabric-manager) FABRIC_MANAGER=1 ;;
    --vllm) [ "$#" -ge 2 ] || { usage >&2; exit 2; }; RUNTIME=vllm; RUNTIME_VERSION=$2; shift ;;
    --runtime) [ "$#" -ge 2 ] || { usage >&2; exit 2; }; RUNTIME=$2; shift ;;
    --runtime-version) [ "$#" -ge 2 ] || { usage >&2; exit 2; }; RUNTIME_VERSION=$2; shift ;;
    --runtime-dir) [ "$#" -ge 2 ] || { usage >&2; exit 2; }; RUNTIME_DIR=$2; shift ;;
    --appliance-memory) [ "$#" -ge 2 ] || { usage >&2; exit 2; }; APPLIANCE_MEMORY=$2; shift ;;
    --appliance-cpus) [ "$#" -ge 2 ] || { usage >&2; exit 2; }; APPLIANCE_CPUS=$2; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; POSITIONAL+=("$@"); break ;;
    -*) echo "bake: unknown option $1" >&2; usage >&2; exit 2 ;;
    *) POSITIONAL+=("$1") ;;
  esac
  shift
done
if [ "${#POSITIONAL[@]}" -ne 2 ]; then
  usage >&2
  exit 2
fi
SRC=${POSITIONAL[0]}
DST=${POSITIONAL[1]}
PARTIAL="${DST}.partial"

NVIDIA_DRIVER=${NVIDIA_DRIVER:-${FABRIC_NVIDIA_VERSION}}  # no --nvidia-driver: versions.env's pin
case "${NVIDIA_DRIVER}" in
  [0-9]*.[0-9]*) ;;
  *) die "--nvidia-driver ${NVIDIA_DRIVER}: give an exact version like ${FABRIC_NVIDIA_VERSION}, not a branch" ;;
esac
case "${NVIDIA_DRIVER}${CUDA/#auto/}" in
  *[!0-9.-]*) die "--nvidia-driver/--cuda: digits, '.' and '-' only (or --cuda auto)" ;;
esac
# CMake's list separator is ';'; a comma list is accepted and converted. Each entry is a real
# architecture number (sm_XX), so the value is safe inside the appliance's command line.
CUDA_ARCHS=${CUDA_ARCHS//,/;}
case "${CUDA_ARCHS}" in
  ''|*[!0-9\;]*|*\;\;*|\;*|*\;) die "--cuda-archs ${CUDA_ARCHS}: CUDA architecture numbers separated by ',' or ';' (e.g. 80,86,89,90)" ;;
esac
if [ -z "${RUNTIME_VERSION}" ]; then
  case "${RUNTIME}" in
    vllm) RUNTIME_VERSION=${FABRIC_VLLM_VERSION} ;;
    tensorrt-llm) RUNTIME_VERSION=${FABRIC_TRTLLM_VERSION} ;;
    *) RUNTIME_VERSION=latest ;;
  esac
fi
if [ "${RUNTIME}" = tensorrt-llm ] && [ "${NVIDIA_DRIVER%%.*}" -lt "${FABRIC_TRTLLM_MIN_DRIVER_BRANCH}" ]; then
  die "TensorRT-LLM ${RUNTIME_VERSION} is built with CUDA 13: pass --nvidia-driver of branch ${FABRIC_TRTLLM_MIN_DRIVER_BRANCH} or newer (not ${NVIDIA_DRIVER})"
fi
if [ -z "${APPLIANCE_MEMORY}" ]; then
  if [ "${RUNTIME}" = llama.cpp ]; then APPLIANCE_MEMORY=16384; else APPLIANCE_MEMORY=8192; fi
fi
if [ -z "${APPLIANCE_CPUS}" ]; then
  APPLIANCE_CPUS=$(nproc 2>/dev/null || echo 2)
  [ "${APPLIANCE_CPUS}" -le 16 ] || APPLIANCE_CPUS=16
fi
case "${APPLIANCE_MEMORY}${APPLIANCE_CPUS}" in
  *[!0-9]*) die "--appliance-memory/--appliance-cpus: whole numbers" ;;
esac

# Where each runtime lives in the guest (common/runtimes.py has the same paths).
case "${RUNTIME}" in
  vllm) OPT_DIR=/opt/vllm ;;
  tensorrt-llm) OPT_DIR=/opt/trtllm ;;
  llama.cpp) OPT_DIR=/opt/llama.cpp ;;
  triton) OPT_DIR=/opt/tritonserver; PREBUILT=bin/tritonserver ;;
  tei) OPT_DIR=/opt/tei; PREBUILT=bin/text-embeddings-router ;;
  *) echo "bake: unknown runtime ${RUNTIME}; expected vllm, tensorrt-llm, triton, llama.cpp or tei" >&2
     usage >&2; exit 2 ;;
esac
case "${RUNTIME_VERSION}" in
  *[!A-Za-z0-9._-]*) die "--runtime-version ${RUNTIME_VERSION}: letters, digits, '.', '_' and '-' only" ;;
esac
if [ -n "${PREBUILT:-}" ]; then
  [ -n "${RUNTIME_DIR}" ] || die "runtime ${RUNTIME} has no package to install: pass --runtime-dir with ${PREBUILT}"
  [ -f "${RUNTIME_DIR}/${PREBUILT}" ] || die "--runtime-dir ${RUNTIME_DIR} has no ${PREBUILT}"
elif [ -n "${RUNTIME_DIR}" ]; then
  die "--runtime-dir is for triton and tei only (${RUNTIME} is installed from its own source)"
fi

[ -f "${SRC}" ] || die "source image ${SRC} does not exist"
[ "$(realpath -m "${SRC}")" != "$(realpath -m "${DST}")" ] || die "SRC and DST are the same file"
if [ -e "${DST}" ] && [ "${FORCE}" -ne 1 ]; then
  die "${DST} exists; pass --force to overwrite it"
fi
for piece in guest/install-guest.sh guest/engine.service.in cloud-init/99-fabric.cfg; do
  [ -f "${IMAGES}/${piece}" ] || die "missing guest piece ${IMAGES}/${piece}"
done

if [ "${DRY_RUN}" -ne 1 ]; then
  command -v qemu-img >/dev/null || die "qemu-img not found: apt-get install qemu-utils"
  command -v virt-customize >/dev/null ||
    die "virt-customize not found: apt-get install libguestfs-tools (Debian/Ubuntu) or dnf install guestfs-tools"
fi

STEP=0
step() {
  STEP=$((STEP + 1))
  echo "==> step ${STEP}: $*"
}

run() {
  printf '    +'
  printf ' %q' "$@"
  printf '\n'
  if [ "${DRY_RUN}" -ne 1 ]; then
    "$@"
  fi
}

cleanup() {
  if [ "${DRY_RUN}" -ne 1 ] && [ -e "${PARTIAL}" ]; then
    rm -f "${PARTIAL}"
  fi
}
trap cleanup EXIT

[ "${DRY_RUN}" -eq 1 ] && echo "bake: dry run, nothing is executed"

step "copy ${SRC} into it and grow the disk to ${SIZE} (the source is only read; the partition grows inside the next step)"
run qemu-img convert -q -O qcow2 "${SRC}" "${PARTIAL}"
run qemu-img resize -q "${PARTIAL}" "${SIZE}"

if [ -n "${PREBUILT:-}" ]; then
  step "upload the prebuilt ${RUNTIME} tree ${RUNTIME_DIR} to ${OPT_DIR}"
  run virt-customize -a "${PARTIAL}" --mkdir "${OPT_DIR}" --copy-in "${RUNTIME_DIR}/.:${OPT_DIR}"
fi

flavour="NVIDIA driver ${NVIDIA_DRIVER}"
[ "${OPEN_MODULES}" -eq 1 ] && flavour+=" (open kernel modules)"
[ "${FABRIC_MANAGER}" -eq 1 ] && flavour+=" + fabric manager"
step "grow ${FABRIC_ROOT_PARTITION} and its filesystem (growpart + resize2fs), install ${flavour} and CUDA ${CUDA} for the guest kernel (held with the kernel), ${RUNTIME} ${RUNTIME_VERSION} in ${OPT_DIR} (its command lines checked by its own parser or --help: engine-args.json)"
run virt-customize -a "${PARTIAL}" --network --memsize "${APPLIANCE_MEMORY}" --smp "${APPLIANCE_CPUS}" \
  --upload "${IMAGES}/guest/install-guest.sh:/tmp/install-guest.sh" \
  --upload "${IMAGES}/guest/engine-args.json:/tmp/engine-args.json" \
  --upload "${IMAGES}/guest/check-vllm-args.py:/tmp/check-vllm-args.py" \
  --run-command "FABRIC_ROOT_PARTITION=${FABRIC_ROOT_PARTITION} FABRIC_NVIDIA_VERSION=${NVIDIA_DRIVER} FABRIC_CUDA=${CUDA} FABRIC_CUDA_UBUNTU2204=${FABRIC_CUDA_UBUNTU2204} FABRIC_CUDA_UBUNTU2404=${FABRIC_CUDA_UBUNTU2404} FABRIC_CUDA_ARCHS='${CUDA_ARCHS}' FABRIC_NVIDIA_OPEN=${OPEN_MODULES} FABRIC_FABRIC_MANAGER=${FABRIC_MANAGER} FABRIC_MIN_FREE_GIB=${FABRIC_MIN_FREE_GIB} FABRIC_RUNTIME=${RUNTIME} FABRIC_RUNTIME_VERSION=${RUNTIME_VERSION} FABRIC_ENGINE_CHECKS=/tmp/engine-args.json bash /tmp/install-guest.sh" \
  --delete /tmp/install-guest.sh --delete /tmp/engine-args.json --delete /tmp/check-vllm-args.py

step "add the guest pieces the VM driver expects (cloud-init config, engine unit template)"
run virt-customize -a "${PARTIAL}" \
  --mkdir /usr/local/share/fabric \
  --upload "${IMAGES}/guest/engine.service.in:/usr/local/share/fabric/engine.service.in" \
  --upload "${IMAGES}/cloud-init/99-fabric.cfg:/etc/cloud/cloud.cfg.d/99-fabric.cfg"

step "reset identity so every replica boots as a new machine"
run virt-customize -a "${PARTIAL}" --run-command "cloud-init clean --logs" \
  --truncate /etc/machine-id --delete /var/lib/dbus/machine-id

step "move the finished image into place as ${DST}"
run mv -f "${PARTIAL}" "${DST}"

step "write the SHA-256 beside it as ${DST}.sha256"
# Relative name inside the file, so `sha256sum -c` works wherever the pair is copied.
printf '    + sha256sum %q > %q\n' "$(basename "${DST}")" "${DST}.sha256"
if [ "${DRY_RUN}" -ne 1 ]; then
  (cd "$(dirname "${DST}")" && sha256sum "$(basename "${DST}")") >"${DST}.sha256"
fi

if [ "${DRY_RUN}" -eq 1 ]; then
  echo "bake: dry run done; nothing was written"
else
  echo "bake: done: ${DST} ($(cut -d' ' -f1 "${DST}.sha256"))"
fi
