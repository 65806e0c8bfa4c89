"""The suite-wide skip rule in tests/conftest.py, run on a small inner test session."""

from __future__ import annotations

from pathlib import Path

import pytest

CONFTEST = (Path(__file__).parent / "conftest.py").read_text()


@pytest.fixture
def inner(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.delenv("FABRIC_TEST_ALLOW_SKIPS", raising=False)
    pytester.makeconftest(CONFTEST.replace('pytest_plugins = ["pytester"]', ""))
    return pytester


def test_a_missing_tool_skip_fails_the_run_and_is_named(inner):
    inner.makepyfile(test_x="""
        import pytest
        def test_ok(): pass
        def test_tool(): pytest.skip("qemu-img (qemu-utils) not installed")
    """)
    result = inner.runpytest()
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*NOT ALLOWED: test_x.py::test_tool: qemu-img (qemu-utils) not installed*"])


def test_hardware_skips_on_the_allow_list_pass_and_are_printed(inner):
    inner.makepyfile(test_y="""
        import pytest
        def test_ok(): pass
        def test_gpu(): pytest.skip("no NVIDIA GPU on this host")
        @pytest.mark.skipif(True, reason="/dev/kvm is absent")
        def test_kvm(): pass
    """)
    result = inner.runpytest()
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["*allow-list: no GPU, no KVM*",
                                 "*allowed (no GPU): test_y.py::test_gpu*",
                                 "*allowed (no KVM): test_y.py::test_kvm*"])


def test_opt_out_lists_but_does_not_fail(inner, monkeypatch):
    monkeypatch.setenv("FABRIC_TEST_ALLOW_SKIPS", "1")
    inner.makepyfile(test_z="""
        import pytest
        def test_root(): pytest.skip("needs root")
    """)
    result = inner.runpytest()
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["*NOT ALLOWED: test_z.py::test_root: needs root*"])


def test_a_failing_run_keeps_its_own_status(inner):
    inner.makepyfile(test_w="""
        def test_bad(): assert False
    """)
    assert inner.runpytest().ret == pytest.ExitCode.TESTS_FAILED


def test_a_module_skipped_at_collection_fails_the_run_and_is_named(inner):
    inner.makepyfile(test_ok="def test_ok(): pass", test_lib="""
        import pytest
        libvirt_like = pytest.importorskip("no_such_module_for_the_skip_rule")
        def test_never_runs(): pass
    """)
    result = inner.runpytest()
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*NOT ALLOWED: test_lib.py: could not import 'no_such_module_for_the_skip_rule'*"])


def test_a_lone_module_skipped_at_collection_still_fails(inner):
    inner.makepyfile(test_only="""
        import pytest
        pytest.skip("needs the foo tool", allow_module_level=True)
    """)
    result = inner.runpytest()
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*NOT ALLOWED: test_only.py: needs the foo tool*"])


def test_a_hardware_skip_at_collection_is_allowed(inner):
    inner.makepyfile(test_ok="def test_ok(): pass", test_gpu="""
        import pytest
        pytest.skip("no NVIDIA GPU on this host", allow_module_level=True)
    """)
    result = inner.runpytest()
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["*allowed (no GPU): test_gpu.py: no NVIDIA GPU on this host*"])
