"""No import cycles (issue 48 item 5), over the import graph grimp builds from the source.

Two graphs: the runtime one (every import a process can execute, in functions too) and the one
that adds imports made only for type checking (``if TYPE_CHECKING:``). Neither may hold a cycle:
  - between modules, in any of our packages;
  - between the subpackages and top-level modules of a program (``controlplane.X`` with everything
    under it as one node): fabricd's layering api -> ops -> planners/loops -> snapshot -> records
    -> store, and the agent's, where agent.settings is a bottom module every package may import
    (the hardware, the VM drivers, the model cache and AgentState import each other one way only).
A cycle is reported with one import that closes each of its edges, so the message says which
import to move.
"""

from __future__ import annotations

import grimp
import pytest

ROOTS = ("common", "controlplane", "agent", "gateway", "fabricctl", "enginesim", "lab", "dataplane")
PROGRAMS = ("controlplane", "agent", "gateway", "fabricctl", "enginesim", "lab")  # package cycles checked
# Package cycles still to go, each with who removes it; the test fails once one is gone so that
# its entry goes with it.
PENDING: set[tuple[str, ...]] = set()


def strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components of more than one node (iterative: no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            step = next(successors, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(edges.get(step, ())))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def module_edges(graph) -> dict[str, set[str]]:
    return {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}


def collapsed(edges: dict[str, set[str]], parent: str) -> dict[str, dict[str, tuple[str, str]]]:
    """The edges between ``parent``'s children (each stands for everything under it), each with
    one module import that makes it."""
    prefix = parent + "."

    def child(module: str) -> str | None:
        return prefix + module[len(prefix):].split(".")[0] if module.startswith(prefix) else None

    out: dict[str, dict[str, tuple[str, str]]] = {}
    for importer in sorted(edges):
        a = child(importer)
        for imported in sorted(edges[importer]):
            b = child(imported)
            if a and b and a != b:
                out.setdefault(a, {}).setdefault(b, (importer, imported))
    return out


def describe(component: list[str], why: dict[str, dict[str, tuple[str, str]]]) -> str:
    members = set(component)
    lines = [" <-> ".join(component)]
    for a in component:
        for b, (importer, imported) in sorted(why.get(a, {}).items()):
            if b in members:
                lines.append(f"    {a} -> {b}  ({importer} imports {imported})")
    return "\n".join(lines)


def cycles(type_checking: bool) -> tuple[list[str], list[str]]:
    graph = grimp.build_graph(*ROOTS, exclude_type_checking_imports=not type_checking, cache_dir=None)
    edges = module_edges(graph)
    direct = {a: {b: (a, b) for b in bs} for a, bs in edges.items()}
    modules = [describe(c, direct) for c in strongly_connected(edges)]
    packages = {}
    for program in PROGRAMS:
        why = collapsed(edges, program)
        packages.update({tuple(c): describe(c, why) for c in strongly_connected({a: set(bs) for a, bs in why.items()})})
    return modules, packages


@pytest.mark.parametrize("type_checking", [False, True], ids=["runtime", "with-type-checking"])
def test_no_import_cycles(type_checking):
    modules, packages = cycles(type_checking)
    assert not modules, f"{len(modules)} module cycle(s):\n" + "\n".join(modules)
    new = [why for members, why in packages.items() if members not in PENDING]
    assert not new, f"{len(new)} cycle(s) among a program's packages:\n" + "\n".join(new)
    gone = PENDING - set(packages)
    assert not gone, f"no longer a cycle, remove from PENDING: {sorted(gone)}"


def test_the_check_sees_a_cycle():
    """The component finder reports a cycle (three nodes through one back edge) and no tree."""
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert strongly_connected({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []
    why = collapsed({"p.x.m": {"p.y.n"}, "p.y.n": {"p.x.k"}, "p.x.k": set()}, "p")
    assert strongly_connected({a: set(bs) for a, bs in why.items()}) == [["p.x", "p.y"]]
