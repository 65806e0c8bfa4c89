"""Key scope rules, pure: the endpoint and expiry from headers alone, the model on the operation
(listings of files and batches refused for a model-scoped key; uploads and reads by id allowed;
batch creation is checked on its input file, see test_gateway_hardening_scope)."""

from __future__ import annotations

import time

import pytest

from common.errors import Forbidden, Unauthorized
from common.schemas import ApiKeyRecord
from gateway.batch_scope import check_line
from gateway.key_auth import Identity, check_key, check_model


def ident(model: str | None) -> Identity:
    rec = ApiKeyRecord(id="k1", name="k", prefix="p", hash="h", endpoint="ep", model=model)
    return Identity("key", "k1", None, rec)


def test_key_scope_from_headers_alone():
    now = time.time()
    rec = ident(None).record
    check_key(rec, "ep", now)
    with pytest.raises(Forbidden):
        check_key(rec, "other", now)
    with pytest.raises(Unauthorized):
        check_key(rec.model_copy(update={"expires_at": now - 1}), "ep", now)


def test_model_scoped_key_is_checked_on_the_operation():
    m1 = ident("m1")
    check_model(m1, None, "/v1/models", "GET")
    check_model(m1, "m1", "/v1/chat/completions", "POST")
    for path in ("/v1/files", "/v1/batches", "/v1/files/"):
        with pytest.raises(Forbidden) as exc:
            check_model(m1, None, path, "GET")
        assert "listing" in exc.value.message and exc.value.code == "model_not_allowed"
    check_model(m1, None, "/v1/files", "POST")  # an upload runs nothing
    check_model(m1, None, "/v1/batches", "POST")  # checked on its input file by batch_scope
    check_model(m1, None, "/v1/batches/b1/cancel", "POST")
    check_model(m1, None, "/v1/files/f1/content", "GET")
    # What a body claims is not a way in: the model must be the key's on every other route.
    with pytest.raises(Forbidden):
        check_model(m1, "m2", "/v1/chat/completions", "POST")
    with pytest.raises(Forbidden):
        check_model(m1, None, "/v1/chat/completions", "POST")
    with pytest.raises(Forbidden):
        check_model(m1, "m2", "/v1/files", "GET")


def test_unscoped_key_uses_files_and_batches():
    for path in ("/v1/files", "/v1/batches", "/v1/models"):
        check_model(ident(None), None, path, "GET")


def test_batch_lines_must_name_the_keys_model():
    check_line(b'{"custom_id":"a","body":{"model":"m1"}}', 1, "m1")
    for line in (b'{"body":{"model":"m2"}}', b'{"body":{}}', b"not json", b"[1]"):
        with pytest.raises(Forbidden) as exc:
            check_line(line, 3, "m1")
        assert "line 3" in exc.value.message
