"""What the golden image was baked with: images/guest/versions.env, the one file the bake
script sources for its versions (scripts/bake-ai-vllm-image.sh), read here for the choices the
agent makes from them (vLLM's accepted LoRA ranks, the TensorRT-LLM options). The file is the
agent's own package data (agent/vm/images), the versions this agent was built and baked with;
FABRIC_IMAGES_DIR (AgentSettings.images_dir) moves only the guest pieces a seed is made from."""

from __future__ import annotations

from functools import cache

from agent.vm.cloud_init import images_dir


@cache
def baked_versions() -> dict[str, str]:
    out = {}
    for line in (images_dir() / "guest/versions.env").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "=" in line:
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip().strip("\"'")
    return out


def baked_vllm_version() -> str:
    return baked_versions().get("FABRIC_VLLM_VERSION", "latest")
