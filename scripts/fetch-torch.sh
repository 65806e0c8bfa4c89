#!/usr/bin/env bash
# Fetch the pinned CPU build of torch (e.g. torch==2.13.0+cpu) as a wheel into DIR, for
# scripts/setup-engine.sh to install before the rest of scripts/engine-requirements.txt.
#   scripts/fetch-torch.sh PYTHON PIN DIR   -> prints where the wheel came from
# First from the machine's configured pip sources (pip.conf, PIP_INDEX_URL, PIP_FIND_LINKS: some
# machines carry the +cpu wheel in a local wheel directory); PyPI has no +cpu builds, so when they
# lack it, from PyTorch's own CPU wheel index, where users get it (FABRIC_TORCH_INDEX overrides the
# address, for a mirror of that index). --no-deps: the requirements file lists torch's own.
set -euo pipefail
if [ $# -ne 3 ]; then echo "usage: $0 PYTHON PIN DIR" >&2; exit 2; fi
py=$1 pin=$2 dest=$3
index=${FABRIC_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
fetch() { "$py" -m pip download -q --no-deps --only-binary=:all: -d "$dest" "$@" "$pin" >&2; }
if fetch 2>/dev/null; then
  echo "the configured pip sources"
  exit 0
fi
# --index-url replaces the configured index for this one wheel; find-links still apply (they lack it).
fetch --index-url "$index"
echo "$index"
