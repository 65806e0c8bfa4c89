"""One simulated lab shared by the chapters that ask for `shared_lab` (the story, no-drop and
rollout chapters): it comes up once, each module starts on it as on a fresh lab (SharedLab.get
deletes what the modules before left), and it goes down as soon as the next test does not use
it, since the lab's names are fixed and another module's own lab (the real-engine one, the
CLI's) could not come up beside it. Collection keeps the sharing modules next to each other,
in their file order, where the first of them stood; no module depends on another having run."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from lab.cluster import LabConfig
from tests.e2e.lab_harness import SharedLab

SHARED = "shared_lab"
_lab = SharedLab()


@pytest.fixture(scope="session")
def shared_lab_holder() -> Iterator[SharedLab]:
    yield _lab
    _lab.close()


@pytest.fixture(scope="module")
def shared_lab(shared_lab_holder: SharedLab) -> tuple[LabConfig, str]:
    """(LabConfig, fabricd token) of the shared lab, as a fresh lab holds it."""
    return shared_lab_holder.get()


def _shares(item: pytest.Item) -> bool:
    return SHARED in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    sharing = [i for i in items if _shares(i)]
    if not sharing:
        return
    at = items.index(sharing[0])
    rest = [i for i in items if not _shares(i)]
    items[:] = rest[:at] + sharing + rest[at:]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    yield  # the item's fixtures (the module's clients among them) are torn down first
    if _lab.is_up and _shares(item) and (nextitem is None or not _shares(nextitem)):
        _lab.close()
