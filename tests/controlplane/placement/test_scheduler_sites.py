"""Placement across sites: residency (site records), no-site nodes, minimum_sites and
max_replicas_per_site, each named in the rejection reasons that explain placement returns."""

from common.schemas import Site
from controlplane.placement.index import place
from controlplane.placement.scheduler import SchedulerSettings
from tests.controlplane.planner_data import NOW, deployment, model, node, profile, replica

SITES = {"pune": Site(name="pune", residency="india"), "mumbai": Site(name="mumbai", residency="india"),
         "dublin": Site(name="dublin", residency="eu")}
NODES = [node("a", site="pune"), node("b", site="mumbai"), node("c", site="dublin"), node("d", site="")]


def run(dep, mdl=None, replicas=(), nodes=NODES):
    return place(dep, profile(), mdl or model(), nodes, {}, NOW, SchedulerSettings(), replicas=list(replicas),
                 sites=SITES)


def test_residency_uses_site_records_and_excludes_nodes_without_a_site():
    plan = run(deployment(residency="india"))
    assert plan.node == "a"
    assert "outside residency 'india' (its residency is 'eu')" in plan.rejected["c"]
    assert "no site" in plan.rejected["d"]
    plan = run(deployment(), mdl=model(residency="eu"))  # the model's own residency holds too
    assert plan.node == "c" and "the model's" in plan.rejected["a"]


def test_no_site_node_is_fine_when_nothing_restricts_sites():
    assert run(deployment(), nodes=[node("d", site="")]).node == "d"
    assert run(deployment(allowed_sites=["pune"]), nodes=[node("d", site="")]).node is None


def test_max_replicas_per_site():
    dep = deployment(replicas=3, max_replicas_per_site=1, residency="india")
    plan = run(dep, replicas=[replica(0, "a")])
    assert plan.node == "b"
    assert "max_replicas_per_site is 1" in plan.rejected["a"]
    plan = run(dep, replicas=[replica(0, "a"), replica(1, "b")])
    assert plan.node is None and "max_replicas_per_site" in plan.message


def test_minimum_sites_spreads_before_doubling_up():
    # Without minimum_sites a second node in the same site could win; with it, another site must.
    nodes = [node("a", site="pune", domain="r"), node("a2", site="pune", domain="r2"),
             node("c", site="dublin", domain="r")]
    plain = run(deployment(replicas=2), replicas=[replica(0, "a")], nodes=nodes)
    assert plain.node == "a2"
    spread = run(deployment(replicas=2, minimum_sites=2), replicas=[replica(0, "a")], nodes=nodes)
    assert spread.node == "c"
    assert "minimum_sites 2 wants another site first" in spread.rejected["a2"]
    # once two sites are used, the rule no longer holds a site back
    assert run(deployment(replicas=3, minimum_sites=2), replicas=[replica(0, "a"), replica(1, "c")],
               nodes=nodes).node == "a2"
