"""common.apikeys.rotated with renew (an agent runtime credential's refresh): the new secret lives
ttl_secs from now, the old one exactly until it was due to expire, and never past it."""

from __future__ import annotations

from common import apikeys

SECRET = b"renew-test-secret"


def test_renew_extends_expiry_and_keeps_the_old_secret_until_its_own_end():
    record, old = apikeys.build_record(apikeys.KeySpec(name="agent-runtime-a", endpoint="e", ttl_secs=90), SECRET,
                                       now=1000.0)
    assert record.expires_at == 1090.0
    renewed, new = apikeys.rotated(record, SECRET, 3600, 1060.0, renew=True)
    assert renewed.expires_at == 1150.0 and renewed.previous_valid_until == 1090.0
    assert apikeys.secret_matches(renewed, new, SECRET, 1149.0)
    assert apikeys.secret_matches(renewed, old, SECRET, 1089.0)
    assert not apikeys.secret_matches(renewed, old, SECRET, 1090.0)  # the overlap never outlives the old expiry
    # Renewing after the old secret expired carries no previous secret at all.
    late, _ = apikeys.rotated(record, SECRET, 3600, 1100.0, renew=True)
    assert late.previous_hash is None and late.previous_valid_until is None and late.expires_at == 1190.0


def test_a_plain_rotation_keeps_the_expiry():
    record, _ = apikeys.build_record(apikeys.KeySpec(name="k", endpoint="e", ttl_secs=90), SECRET, now=1000.0)
    rotated, _ = apikeys.rotated(record, SECRET, 30, 1060.0)
    assert rotated.expires_at == 1090.0 and rotated.previous_valid_until == 1090.0
