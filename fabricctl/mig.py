"""`fabricctl ai node mig-create | mig-delete | mig-list`: MIG slices on a node's GPUs.

    node mig-create NODE --parent-bdf BDF --profile P   a slice (1g.10gb, 2g.20gb, 3g.40gb, 7g.80gb)
    node mig-delete NODE SLICE                          refused while a replica holds it
    node mig-list NODE
"""

from __future__ import annotations

import typer

from fabricctl.output import col, emit_object, emit_table, session

JSON_OPT = typer.Option(False, "--json", help="print JSON for scripts")
SLICE_COLUMNS = [col("SLICE", "id"), col("PARENT", "parent_bdf"), col("PROFILE", "profile"),
                 col("MEM_GIB", "memory_gib"), col("MODE", "mode"),
                 ("GI/CI", lambda s: "-" if s.get("gpu_instance_id") is None
                  else f"{s['gpu_instance_id']}/{s.get('compute_instance_id')}")]


def mig_create(
    node: str = typer.Argument(..., metavar="NODE", help="the node's id"),
    parent_bdf: str = typer.Option(..., "--parent-bdf", help="the GPU to slice (its PCI address)"),
    profile: str = typer.Option(..., "--profile", help="1g.10gb, 2g.20gb, 3g.40gb or 7g.80gb (or 1g, 2g, 3g, 7g)"),
    as_json: bool = JSON_OPT,
) -> None:
    """Create a MIG slice on one of NODE's GPUs."""
    with session() as c:
        made = c.post(f"/api/ai/nodes/{node}/mig", {"parent_bdf": parent_bdf, "profile": profile})
    if as_json:
        emit_object(made, True)
        return
    typer.echo(f"MIG slice {made['id']} created on {node} ({made['mode']})")


def mig_delete(
    node: str = typer.Argument(..., metavar="NODE", help="the node's id"),
    slice_id: str = typer.Argument(..., metavar="SLICE", help="the slice id, PARENT--PROFILE--N"),
    as_json: bool = JSON_OPT,
) -> None:
    """Delete a MIG slice (refused while a replica holds it)."""
    with session() as c:
        done = c.delete(f"/api/ai/nodes/{node}/mig/{slice_id}")
    if as_json:
        emit_object(done, True)
        return
    typer.echo(f"MIG slice {slice_id} deleted from {node}")


def mig_list(node: str = typer.Argument(..., metavar="NODE", help="the node's id"), as_json: bool = JSON_OPT) -> None:
    """List NODE's MIG slices."""
    with session() as c:
        emit_table(c.get(f"/api/ai/nodes/{node}/mig"), SLICE_COLUMNS, as_json)
