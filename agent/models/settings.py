"""The agent's model supply chain settings, read from its environment (docs/models.md, Settings)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from common.model_manifest import DEFAULT_MAX_FILES


@dataclass(frozen=True)
class ModelSettings:
    model_dir: str = "/srv/models"  # FABRIC_MODEL_DIR: local sources must be under it
    max_files: int = DEFAULT_MAX_FILES  # FABRIC_MODEL_MAX_FILES
    signing_key: bytes | None = field(default=None, repr=False)  # FABRIC_MODEL_SIGNING_KEY
    retries: int = 3  # FABRIC_MODEL_RETRIES
    retry_base_s: float = 1.0
    download_workers: int = 4  # FABRIC_MODEL_DOWNLOAD_WORKERS: files fetched at once
    env: dict[str, str] = field(default_factory=dict, repr=False)  # HF_ENDPOINT, HF_TOKEN, FABRIC_HF_TOKEN_FILE

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> ModelSettings:
        env = dict(os.environ if env is None else env)

        def number(name: str, default: int) -> int:
            raw = env.get(name, "").strip()
            try:
                value = int(raw) if raw else default
            except ValueError:
                raise ValueError(f"{name}={raw!r} is not a whole number") from None
            if value < 0:
                raise ValueError(f"{name}={raw!r} must not be negative")
            return value

        key = env.get("FABRIC_MODEL_SIGNING_KEY", "")
        return cls(model_dir=env.get("FABRIC_MODEL_DIR", "/srv/models") or "/srv/models",
                   max_files=number("FABRIC_MODEL_MAX_FILES", DEFAULT_MAX_FILES),
                   signing_key=key.encode() if key else None,
                   retries=number("FABRIC_MODEL_RETRIES", 3),
                   download_workers=number("FABRIC_MODEL_DOWNLOAD_WORKERS", 4) or 1,
                   env={k: v for k, v in env.items() if k in ("HF_ENDPOINT", "HF_TOKEN", "FABRIC_HF_TOKEN_FILE")})
