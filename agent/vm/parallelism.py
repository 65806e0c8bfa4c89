"""Tensor and pipeline parallel sizes for a replica, from the model's config.json and its GPUs.

vLLM refuses a tensor-parallel size that does not divide the attention heads (and the KV heads,
unless the KV heads divide it: they are then replicated). TP = GPU count fails for 3, 5, 6 or 7
GPUs on nearly every model, so: the largest TP that divides both the GPU count and the heads,
with the rest of the GPUs as pipeline stages (PP = GPUs / TP, at most one stage per layer).
When no split works, or the config cannot be read and the GPU count is not a power of two, the
VM create is refused with the reason instead of starting an engine that can only crash-loop.

config.json comes from the host's model directory (the agent wrote it, but it is model-author
content): read at most 1 MiB, must be a JSON object, multimodal configs keep the language
model's numbers under `text_config`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from common.errors import InvalidInput

MAX_CONFIG_BYTES = 1 << 20


@dataclass(frozen=True)
class Parallel:
    tensor: int
    pipeline: int
    why: str


def read_model_config(model_dir: Path) -> dict | None:
    path = Path(model_dir) / "config.json"
    try:
        if not path.is_file():
            return None
        with open(path, "rb") as handle:
            raw = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError:
        return None
    if len(raw) > MAX_CONFIG_BYTES:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _number(config: dict, key: str) -> int | None:
    for scope in (config, config.get("text_config") if isinstance(config.get("text_config"), dict) else {}):
        value = scope.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def choose_parallel(config: dict | None, gpus: int, *, pipeline_ok: bool = True) -> Parallel:
    if gpus <= 1:
        return Parallel(1, 1, "one GPU")
    heads = _number(config or {}, "num_attention_heads")
    if heads is None:
        if gpus & (gpus - 1) == 0:
            return Parallel(gpus, 1, f"config.json gives no num_attention_heads: tensor parallel {gpus} "
                                     "(power-of-two GPU counts divide every common head count)")
        raise InvalidInput(f"cannot split the model over {gpus} GPUs: config.json gives no num_attention_heads, "
                           "and only 1, 2, 4 or 8 GPUs can be used without it")
    kv = _number(config or {}, "num_key_value_heads") or heads
    layers = _number(config or {}, "num_hidden_layers")
    for tp in range(gpus, 0, -1):
        if gpus % tp or heads % tp or (kv % tp and tp % kv):
            continue
        pp = gpus // tp
        if pp > 1 and not pipeline_ok:
            continue
        if layers is not None and pp > layers:
            continue
        why = f"{heads} attention heads, {kv} KV heads over {gpus} GPUs: tensor {tp} x pipeline {pp}"
        return Parallel(tp, pp, why)
    extra = "" if pipeline_ok else " (this runtime has no pipeline parallelism)"
    raise InvalidInput(f"cannot split a model with {heads} attention heads ({kv} KV heads) over {gpus} GPUs"
                       f"{extra}: use a GPU count that divides the heads")
