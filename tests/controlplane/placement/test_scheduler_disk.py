"""Placement refuses a node whose model cache has less free disk than the model's declared size
(explain placement gives that reason); a node holding the model already, an undeclared size or
a node that does not report its disk is no refusal."""

import pytest

from controlplane.placement.index import place
from tests.controlplane.planner_data import NOW, deployment, model, node, profile

GIB = 2**30


@pytest.mark.parametrize("size,free,cached,fits", [
    (16 * GIB, 10 * GIB, False, False),
    (16 * GIB, 20 * GIB, False, True),
    (16 * GIB, 10 * GIB, True, True),  # already on the node: nothing to download
    (None, 1, False, True),  # no declared size
    (16 * GIB, None, False, True),  # the node does not report its disk
])
def test_disk_for_the_declared_model_size(size, free, cached, fits):
    m = model().model_copy(update={"size_bytes": size, "digest": "d" * 64})
    n = node("n1", 2, cached=["d" * 64] if cached else ()).model_copy(update={"model_disk_free_bytes": free})
    plan = place(deployment(1), profile(), m, [n], {}, NOW)
    assert (plan.node == "n1") is fits
    if not fits:
        (verdict,) = plan.verdicts
        assert "not enough free disk for model qwen: 16.0 GiB declared, 10.0 GiB free" in verdict.reason
