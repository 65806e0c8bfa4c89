"""Where a model's files may come from: a local source must lie under FABRIC_MODEL_DIR."""

from __future__ import annotations

from common.errors import InvalidInput
from common.model_api import local_source_path


def check_local_source(source: str, model_dir: str) -> None:
    """A local source must resolve (realpath) under model_dir (FABRIC_MODEL_DIR, default
    /srv/models): 422 otherwise. The agent checks again on its host, where the path lives."""
    if source.startswith("hf://"):
        return
    try:
        local_source_path(source, model_dir)
    except ValueError as exc:
        raise InvalidInput(str(exc), code="bad_source") from None
