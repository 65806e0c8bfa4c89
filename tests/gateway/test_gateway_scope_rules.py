"""Key scope rules for requests whose body names no model (model listing, files, batches)."""

from __future__ import annotations

import time

import pytest

from common.errors import Forbidden
from common.schemas import ApiKeyRecord
from gateway.key_auth import check_scope


def key(model: str | None) -> ApiKeyRecord:
    return ApiKeyRecord(id="k1", name="k", prefix="p", hash="h", endpoint="ep", model=model)


def test_model_scoped_key_may_list_models_but_not_use_files_or_batches():
    now = time.time()
    check_scope(key("m1"), "ep", None, now, "/v1/models")
    check_scope(key("m1"), "ep", "m1", now, "/v1/chat/completions")
    for path in ("/v1/files", "/v1/batches", "/v1/batches/b1/cancel"):
        with pytest.raises(Forbidden) as exc:
            check_scope(key("m1"), "ep", None, now, path)
        assert "files and batches" in exc.value.message and exc.value.code == "model_not_allowed"
    with pytest.raises(Forbidden):
        check_scope(key("m1"), "ep", "m2", now, "/v1/chat/completions")
    with pytest.raises(Forbidden):
        check_scope(key("m1"), "ep", None, now, "/v1/chat/completions")


def test_unscoped_key_uses_files_and_batches():
    now = time.time()
    for path in ("/v1/files", "/v1/batches", "/v1/models"):
        check_scope(key(None), "ep", None, now, path)
