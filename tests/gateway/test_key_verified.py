"""gateway.key_auth: a key that matched its record is not HMAC'd again while the cache serves
that record; a reloaded, rotated or deleted record, a previous-digest match and a wrong secret
are always checked (real SQLite store, real records)."""

import asyncio

import pytest

from common import apikeys
from common.errors import Unauthorized
from common.store.sqlite_store import SqliteStore
from gateway import key_auth
from gateway.key_auth import Authenticator
from gateway.oidc import OidcVerifier

SECRET = b"test-hmac-secret"


@pytest.fixture
def env(tmp_path, monkeypatch):
    store = SqliteStore(tmp_path / "fabric.db")
    calls = []
    real = apikeys.secret_matches

    def counted(*a):
        calls.append(a[1])
        return real(*a)

    monkeypatch.setattr(apikeys, "secret_matches", counted)
    auth = Authenticator(store, SECRET, OidcVerifier([], False, "fabric_endpoints"), ttl_secs=30)
    yield store, auth, calls
    store.close()


def who(auth, key, endpoint="chat"):
    return asyncio.run(auth.identify({"authorization": f"Bearer {key}"}, endpoint))


def test_a_matched_key_skips_the_hmac_until_its_record_changes(env):
    store, auth, calls = env
    record, key = apikeys.create_key(store, apikeys.KeySpec(name="a", endpoint="chat"), SECRET)
    assert who(auth, key).subject == record.id
    assert who(auth, key).subject == record.id
    assert len(calls) == 1  # the second call: the remembered match
    with pytest.raises(Unauthorized):  # a wrong secret on the same prefix: checked, refused, not remembered
        who(auth, f"fvai_{record.prefix}_{'x' * 43}")
    with pytest.raises(Unauthorized):
        who(auth, f"fvai_{record.prefix}_{'x' * 43}")
    assert len(calls) == 3
    auth._cache._entries.clear()
    assert who(auth, key).subject == record.id  # a reloaded record is another object: checked again
    assert len(calls) == 4


def test_a_rotated_key_in_its_overlap_is_always_checked(env):
    store, auth, calls = env
    record, old = apikeys.create_key(store, apikeys.KeySpec(name="b", endpoint="chat"), SECRET)
    assert who(auth, old).subject == record.id
    _, new = apikeys.rotate_key(store, record.id, SECRET, overlap_secs=600)
    auth._cache._entries.clear()
    for _ in range(2):  # the old key matches the previous digest: never remembered
        assert who(auth, old).subject == record.id
    assert len(calls) == 3
    for _ in range(2):  # neither is the new key while the overlap lasts (both digests compared)
        assert who(auth, new).subject == record.id
    assert len(calls) == 5


def test_a_full_memo_starts_over(env, monkeypatch):
    store, auth, calls = env
    monkeypatch.setattr(key_auth, "VERIFIED_MAX", 2)
    keys = [apikeys.create_key(store, apikeys.KeySpec(name=f"k{i}", endpoint="chat"), SECRET)[1] for i in range(3)]
    for k in keys:
        who(auth, k)
    assert len(auth._verified) == 1  # cleared at the third
