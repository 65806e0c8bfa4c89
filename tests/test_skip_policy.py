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


# make test runs the suite on two pytest-xdist workers: the rule holds there too, counted once
XDIST = ("-p", "xdist", "-n", "2")


def test_under_two_workers_both_kinds_of_skip_fail_the_run_and_are_named(inner):
    inner.makepyfile(test_ok="def test_ok(): pass", test_lib="""
        import pytest
        pytest.importorskip("no_such_module_for_the_skip_rule")
        def test_never_runs(): pass
    """, test_tool="""
        import pytest
        def test_tool(): pytest.skip("needs the foo tool")
    """)
    result = inner.runpytest_subprocess(*XDIST)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    out = result.stdout.str()
    assert out.count("NOT ALLOWED: test_lib.py: could not import 'no_such_module_for_the_skip_rule'") == 1, out
    assert out.count("NOT ALLOWED: test_tool.py::test_tool") == 1, out


def test_under_two_workers_an_allowed_skip_passes(inner):
    inner.makepyfile(test_ok="def test_ok(): pass", test_gpu="""
        import pytest
        def test_gpu(): pytest.skip("no NVIDIA GPU on this host")
    """)
    result = inner.runpytest_subprocess(*XDIST)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["*allowed (no GPU): test_gpu.py::test_gpu*"])


def test_under_two_workers_each_file_runs_on_one_worker_in_file_order(inner, tmp_path):
    log = tmp_path / "ran.log"
    body = f"""
        import os
        import pytest
        @pytest.mark.parametrize("n", range(6))
        def test_step(n):
            with open({str(log)!r}, "a") as f:
                f.write(f"{{__name__}} {{n}} {{os.environ['PYTEST_XDIST_WORKER']}}\\n")
    """
    inner.makepyfile(test_a=body, test_b=body, test_c=body)
    result = inner.runpytest_subprocess(*XDIST)
    assert result.ret == pytest.ExitCode.OK
    ran: dict[str, list[tuple[int, str]]] = {}
    for line in log.read_text().splitlines():
        module, n, worker = line.split()
        ran.setdefault(module, []).append((int(n), worker))
    assert sorted(ran) == ["test_a", "test_b", "test_c"]
    for module, steps in ran.items():
        assert [n for n, _ in steps] == list(range(6)), (module, steps)
        assert len({w for _, w in steps}) == 1, (module, steps)
    assert len({steps[0][1] for steps in ran.values()}) == 2  # both workers took a file


def test_the_lab_modules_form_one_group_and_other_files_their_own():
    from tests.conftest import LAB_GROUP, xdist_group_of

    assert xdist_group_of("tests/e2e/test_lab_story.py::test_deploy") == LAB_GROUP
    assert xdist_group_of("tests/e2e/test_lab_real_engine.py::test_x[a]") == LAB_GROUP
    assert xdist_group_of("tests/controlplane/test_lab_state.py::test_y") == LAB_GROUP
    assert xdist_group_of("tests/controlplane/test_api_usage.py::test_z") == "tests/controlplane/test_api_usage.py"
