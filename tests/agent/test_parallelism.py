"""Tensor/pipeline parallel from config.json heads and the GPU count, and the guest seed that
uses it: the share's mount retried, the engine ordered after it and the GPU daemons."""

from __future__ import annotations

import json

import pytest
import yaml

from agent.vm.base import VmSpec
from agent.vm.cloud_init import build_seed
from agent.vm.parallelism import choose_parallel, read_model_config
from common.errors import InvalidInput

LLAMA_70B = {"num_attention_heads": 64, "num_key_value_heads": 8, "num_hidden_layers": 80}
QWEN_7B = {"num_attention_heads": 28, "num_key_value_heads": 4, "num_hidden_layers": 28}


@pytest.mark.parametrize("config, gpus, tp, pp", [
    (LLAMA_70B, 1, 1, 1),
    (LLAMA_70B, 8, 8, 1),
    (LLAMA_70B, 3, 1, 3),  # 64 heads: TP 3 impossible, three pipeline stages
    (LLAMA_70B, 6, 2, 3),
    (QWEN_7B, 4, 4, 1),  # KV heads 4 divide 4
    (QWEN_7B, 8, 4, 2),  # 28 heads: TP 8 no, TP 4 x PP 2
    ({"text_config": {"num_attention_heads": 40, "num_key_value_heads": 8}}, 5, 1, 5),
    (None, 4, 4, 1),
])
def test_split(config, gpus, tp, pp):
    plan = choose_parallel(config, gpus)
    assert (plan.tensor, plan.pipeline) == (tp, pp), plan.why


def test_refusals_name_the_reason():
    with pytest.raises(InvalidInput, match="num_attention_heads"):
        choose_parallel(None, 3)
    with pytest.raises(InvalidInput, match="no pipeline parallelism"):
        choose_parallel(LLAMA_70B, 3, pipeline_ok=False)
    with pytest.raises(InvalidInput, match="32 attention heads"):
        choose_parallel({"num_attention_heads": 32, "num_hidden_layers": 2}, 3)  # 3 stages > 2 layers


def test_config_reading_is_bounded(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_70B))
    assert read_model_config(tmp_path) == LLAMA_70B
    (tmp_path / "config.json").write_text("[1, 2]")
    assert read_model_config(tmp_path) is None
    (tmp_path / "config.json").write_bytes(b" " * (2 << 20))
    assert read_model_config(tmp_path) is None
    assert read_model_config(tmp_path / "missing") is None


def test_seed_uses_the_split_retries_the_mount_and_orders_the_engine(tmp_path):
    model = tmp_path / "meta-llama/Llama-3.1-70B"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps(LLAMA_70B))
    spec = VmSpec(replica_id="r", deployment="d", model_name="llama", model_source="hf://meta-llama/Llama-3.1-70B",
                  gpus=tuple(f"0000:{0x10 + i:02x}:00.0" for i in range(6)))
    _meta, user = build_seed(spec, hostname="fabric-r", models_dir=tmp_path)
    config = yaml.safe_load(user)
    units = {f["path"]: f["content"] for f in config["write_files"]}
    engine = units["/etc/systemd/system/fabric-engine.service"]
    assert "--tensor-parallel-size 2" in engine and "--pipeline-parallel-size 3" in engine
    # ordered after the share and retried until it is mounted (not Requires=: one failure would stick)
    assert "After=" in engine and "fabric-models.service" in engine
    assert "ExecStartPre=/usr/bin/mountpoint -q /models" in engine and "StartLimitIntervalSec=0" in engine
    assert "nvidia-persistenced.service" in engine and "nvidia-fabricmanager.service" in engine
    mount = units["/etc/systemd/system/fabric-models.service"]
    assert "mount /models" in mount and "seq 1 60" in mount
    assert ["systemctl", "enable", "--now", "--no-block", "fabric-models.service"] in config["runcmd"]
    bad = VmSpec(replica_id="r", deployment="d", model_name="llama", model_source="hf://meta-llama/Llama-3.1-70B",
                 gpus=spec.gpus[:3], runtime="tensorrt-llm")
    with pytest.raises(InvalidInput, match="cannot split"):
        build_seed(bad, hostname="fabric-r", models_dir=tmp_path)
