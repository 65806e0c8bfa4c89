"""A tiny model for the lab and the tests: a few safetensors shards written with the
``safetensors`` package, an index and a config.json, laid out like a Hub repository; and a tiny
LoRA adapter of it, laid out as PEFT saves one."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file


def write_tiny_model(path: Path, *, shards: int = 2, hidden: int = 64, layers: int = 2, seed: int = 0,
                     extra_bytes: int = 0) -> Path:
    """Write the model under ``path`` and return it. ``extra_bytes`` adds one more tensor of
    about that size (to make a file big enough to interrupt mid-download)."""
    path.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    weight_map: dict[str, str] = {}
    for shard in range(shards):
        name = f"model-{shard + 1:05d}-of-{shards:05d}.safetensors"
        tensors = {}
        for layer in range(layers):
            key = f"model.layers.{shard * layers + layer}.mlp.weight"
            tensors[key] = rng.standard_normal((hidden, hidden)).astype(np.float16)
            weight_map[key] = name
        if shard == 0 and extra_bytes:
            tensors["model.embed_tokens.weight"] = rng.integers(0, 255, extra_bytes, dtype=np.uint8)
            weight_map["model.embed_tokens.weight"] = name
        save_file(tensors, str(path / name))
    (path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1, sort_keys=True))
    (path / "config.json").write_text(json.dumps({
        "architectures": ["TinyForCausalLM"], "model_type": "tiny", "hidden_size": hidden,
        "num_hidden_layers": shards * layers, "torch_dtype": "float16", "vocab_size": 256,
    }, indent=1))
    return path


def write_tiny_adapter(path: Path, *, rank: int = 8, hidden: int = 64, layers: int = 2, seed: int = 1,
                       base: str = "fab/tiny") -> Path:
    """A LoRA adapter laid out as PEFT saves one (what vLLM's --enable-lora loads):
    ``adapter_config.json`` (rank ``r``, alpha, target modules) and ``adapter_model.safetensors``
    with the A and B matrices of each targeted layer."""
    path.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    tensors = {}
    for layer in range(layers):
        stem = f"base_model.model.model.layers.{layer}.mlp"
        tensors[f"{stem}.lora_A.weight"] = rng.standard_normal((rank, hidden)).astype(np.float16)
        tensors[f"{stem}.lora_B.weight"] = np.zeros((hidden, rank), dtype=np.float16)
    save_file(tensors, str(path / "adapter_model.safetensors"))
    (path / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "base_model_name_or_path": base, "r": rank, "lora_alpha": 2 * rank,
        "lora_dropout": 0.0, "target_modules": ["mlp"], "bias": "none", "task_type": "CAUSAL_LM",
    }, indent=1))
    return path
