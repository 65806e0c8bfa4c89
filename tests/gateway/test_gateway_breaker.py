"""Provider key breakers (gateway.breaker) as state tables."""

from __future__ import annotations

import pytest

from gateway.breaker import Breaker, after, retry_after_secs, usable


@pytest.mark.parametrize("status, state", [(200, "closed"), (400, "closed"), (404, "closed"), (429, "open"),
                                           (500, "open"), (503, "open"), (0, "open"), (401, "refused")])
def test_one_answer_from_closed(status, state):
    assert after(Breaker(), status, now=100.0).state == state


def test_open_half_open_closed_cycle():
    b = after(Breaker(), 429, now=0.0)
    assert (b.state, b.open_until) == ("open", 1.0)
    assert usable(b, 0.5) == (False, b)
    ok, trial = usable(b, 1.0)
    assert ok and trial.state == "half_open" and trial.trial
    assert usable(trial, 1.1)[0] is False  # one trial at a time
    again = after(trial, 503, now=1.2)  # the trial failed: cooldown doubles
    assert (again.state, again.failures, again.open_until) == ("open", 2, 3.2)
    ok, trial = usable(again, 3.2)
    assert ok and after(trial, 200, now=3.3) == Breaker()


def test_cooldown_doubles_to_a_cap_and_retry_after_wins():
    b = Breaker()
    for _ in range(10):
        b = after(b, 500, now=0.0)
    assert b.open_until == 60.0
    assert after(Breaker(), 429, now=0.0, retry_after=7).open_until == 7.0
    assert after(Breaker(), 429, now=0.0, retry_after=10_000).open_until == 300.0


def test_refused_stays_refused():
    b = after(Breaker(), 401, now=0.0)
    assert usable(b, 1e9) == (False, b)


@pytest.mark.parametrize("raw, secs", [(b"5", 5.0), (b" 2.5 ", 2.5), (b"-1", None), (b"Wed, 21 Oct", None),
                                       (None, None)])
def test_retry_after(raw, secs):
    assert retry_after_secs(raw) == secs


def test_key_files_are_read_only_inside_the_key_dir(tmp_path):
    from gateway.external import _read_key, inside

    root = tmp_path / "keys"
    root.mkdir()
    (root / "ok").write_text(" sk-abc \n")
    (tmp_path / "secret").write_text("s3cret")
    (root / "link").symlink_to(tmp_path / "secret")
    (root / "bin").write_bytes(b"sk-\x00abc")
    assert inside(str(root / "ok"), str(root)) and not inside(str(root), str(root))
    assert not inside(str(root / ".." / "secret"), str(root)) and not inside(str(root / "link"), str(root))
    assert _read_key(str(root / "ok"), str(root)) == "sk-abc"
    assert _read_key(str(root / "link"), str(root)) is None  # a symlink out is refused
    assert _read_key(str(root / "bin"), str(root)) is None  # not printable ASCII
    assert _read_key(str(root / "missing"), str(root)) is None


def test_only_v1_paths_reach_a_provider():
    from gateway.external import provider_path, split_url

    assert split_url("https://api.example/v1") == ("https", "api.example", 443, b"/v1")
    assert split_url("http://[::1]:8080") == ("http", "::1", 8080, b"")
    assert provider_path(b"/v1", b"/v1/chat/completions") == b"/v1/chat/completions"
    assert provider_path(b"/openai/v1", b"/v1/models?x=1") == b"/openai/v1/models?x=1"
    assert provider_path(b"/v1", b"/health") is None and provider_path(b"/v3", b"/v1x/kv") is None
