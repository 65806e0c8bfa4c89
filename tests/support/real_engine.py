"""The real engine (vLLM's CPU build in .venv-engine, scripts/setup-engine.sh) as the real-engine
tests start it: the lab's tiny model and its LoRA adapters written under a temporary folder, and
the `vllm serve` command line and environment that serve it on loopback."""

from __future__ import annotations

import os
from pathlib import Path

from agent.settings import DEFAULT_KV_BYTES, REPO_ENGINE_PYTHON
from agent.vm.lab_engine import engine_installed, real_engine_argv, real_engine_env
from lab.tiny_model import write_tiny_adapter, write_tiny_model

MODEL = "tiny-chat"


def tiny_model_and_adapters(tmp: Path, adapters: dict[str, int]) -> tuple[Path, Path]:
    """Fail unless the engine is installed; write the tiny model to tmp/model and each adapter
    (name: seed) to tmp/adapters/NAME. Returns (model, adapters folder)."""
    missing = engine_installed()
    assert missing is None, f"the real engine is part of setup (scripts/setup-engine.sh): {missing}"
    model = write_tiny_model(tmp / "model")
    folder = tmp / "adapters"
    for name, seed in adapters.items():
        write_tiny_adapter(folder / name, seed=seed, base=MODEL)
    return model, folder


def real_engine_command(model: Path, port: int, tag: str, state: Path, *, max_loras: int,
                        extra: tuple[str, ...] = ()) -> tuple[list[str], dict[str, str]]:
    """argv and environment of `vllm serve MODEL` on 127.0.0.1:port (two sequences, LoRA on at
    rank 8, `extra` flags last), with its state under `state`."""
    guest = ["vllm", "serve", str(model), "--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(port),
             "--max-num-seqs", "2", "--enable-lora", "--max-loras", str(max_loras), "--max-lora-rank", "8", *extra]
    return (real_engine_argv(guest, REPO_ENGINE_PYTHON, tag, DEFAULT_KV_BYTES),
            real_engine_env(state, lora=True, base=os.environ))
