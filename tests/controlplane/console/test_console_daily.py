"""The console's daily writes (controlplane.console.daily, schema_form) over real HTTPS against the
real fabricd of conftest.py: forms carry the API models' fields, delete asks first and then
deletes through the API, an admin drains and uncordons a node, and the usage page shows the
usage ledger's rollup and each tenant's room; the viewer is refused every one of these writes."""

from __future__ import annotations

import time

import httpx
from pydantic import Field

from common.agent_api import NodeReport
from common.pki import client_ssl_context
from common.schemas import InferenceProfile
from common.store import open_store
from common.usage_ledger import Dims
from controlplane.console import forms
from controlplane.console.schema_form import fields_of
from gateway.usage_ledger import Call, UsageLedger
from tests.controlplane.console.conftest import CONSOLE, csrf_of, signed_in


def test_forms_are_the_api_models_fields():
    names = {f.name for f in forms.PROFILE_FIELDS}
    assert {"max_model_len", "extra_args", "gpu.mig_profile", "gpu.vram_gib"} <= names
    assert {"hold_secs", "forwarding", "routing_l7", "allowed_sites"} <= {f.name for f in forms.ENDPOINT_FIELDS}
    assert "capacity_class" in {f.name for f in forms.DEPLOYMENT_FIELDS}
    assert not {"status", "created_at", "tenant", "revision"} & {f.name for f in forms.DEPLOYMENT_FIELDS}

    class Wider(InferenceProfile):  # a field the API gains shows up in the form unedited
        new_knob: int = Field(3, ge=1, description="a knob added later")

    knob = next(f for f in fields_of(Wider) if f.name == "new_knob")
    assert (knob.kind, knob.integer, knob.default, knob.hint) == ("number", True, "3", "a knob added later")


def test_a_list_field_is_one_item_per_line_and_an_unsent_checkbox_keeps_the_api_default():
    body, bad = forms.to_body(forms.ENDPOINT_FIELDS, {"name": "e", "deployment": "d", "allowed_sites": "a\n\n b \n"})
    assert not bad and body["allowed_sites"] == ["a", "b"] and "openai_compatible" not in body
    body, _ = forms.to_body(forms.ENDPOINT_FIELDS, {"name": "e", "deployment": "d", "openai_compatible": "off"})
    assert body["openai_compatible"] is False


def test_delete_asks_first_then_deletes_through_the_api(cluster):
    with cluster.api() as api:
        assert api.post("/api/ai/profiles", json={"name": "del-p", "gpu": {"vram_gib": 24}, "cpu": 1,
                                                  "memory_gib": 1}).status_code == 201
    with signed_in(cluster, "viewer") as c:
        asked = c.get(f"{CONSOLE}/profiles/del-p/delete")
        assert asked.status_code == 200 and "read-only" in asked.text
        r = c.post(f"{CONSOLE}/profiles/del-p/delete", data={"csrf": csrf_of(c.get(f"{CONSOLE}/keys").text)})
        assert r.status_code == 403
    with signed_in(cluster) as c:
        listed = c.get(f"{CONSOLE}/profiles").text
        assert f'href="{CONSOLE}/profiles/del-p/delete"' in listed
        asked = c.get(f"{CONSOLE}/profiles/del-p/delete")
        assert asked.status_code == 200 and "Delete profile del-p?" in asked.text
        with cluster.api() as api:
            assert api.get("/api/ai/profiles/del-p").status_code == 200  # asking deletes nothing
        assert c.post(f"{CONSOLE}/profiles/del-p/delete", data={}).status_code == 403  # no CSRF
        r = c.post(f"{CONSOLE}/profiles/del-p/delete", data={"csrf": csrf_of(asked.text)})
        assert r.status_code == 303 and "deleted" in r.headers["location"]
        assert c.get(f"{CONSOLE}/profiles/del-p/delete").status_code == 404
        assert c.get(f"{CONSOLE}/widgets/x/delete").status_code == 404
    with cluster.api() as api:
        assert api.get("/api/ai/profiles/del-p").status_code == 404


def _idle_node(cluster, api) -> None:
    """A node with no GPUs and no CPU: nothing is ever placed there, so draining it moves nothing."""
    issued = api.post("/api/ai/nodes/idle-node/certificate", json={"hosts": ["127.0.0.1"]}).json()
    tmp = cluster.server.state_dir.parent
    for name, field in (("idle.crt", "cert_pem"), ("idle.key", "key_pem"), ("idle-ca.crt", "ca_pem")):
        (tmp / name).write_text(issued[field])
    ctx = client_ssl_context(tmp / "idle-ca.crt", tmp / "idle.crt", tmp / "idle.key")
    with httpx.Client(base_url=cluster.server.url, verify=ctx, timeout=10) as node:
        r = node.post("/api/ai/nodes", json=NodeReport(id="idle-node", address="https://127.0.0.1:9444",
                                                       vm_driver="dry-run").model_dump(mode="json"))
        assert r.status_code in (200, 201), r.text


def test_an_admin_drains_and_uncordons_a_node(cluster):
    with cluster.api() as api:
        _idle_node(cluster, api)
    with signed_in(cluster) as c:
        page = c.get(f"{CONSOLE}/nodes").text
        assert "Drain idle-node" in page
        r = c.post(f"{CONSOLE}/nodes/idle-node/drain", data={"csrf": csrf_of(page), "reason": "kernel upgrade",
                                                             "grace_secs": "1"})
        assert r.status_code == 303, r.text
        page = c.get(r.headers["location"]).text
        assert "cordoned (kernel upgrade)" in page and "Uncordon idle-node" in page
        with cluster.api() as api:
            assert api.get("/api/ai/nodes/idle-node").json()["cordoned"] == "kernel upgrade"
        bad = c.post(f"{CONSOLE}/nodes/idle-node/drain", data={"csrf": csrf_of(page), "grace_secs": "soon"})
        assert bad.status_code == 422 and "grace_secs" in bad.text
        r = c.post(f"{CONSOLE}/nodes/idle-node/uncordon", data={"csrf": csrf_of(page)})
        assert r.status_code == 303
    with cluster.api() as api:
        assert api.get("/api/ai/nodes/idle-node").json()["cordoned"] == ""
    with signed_in(cluster, "viewer") as c:
        page = c.get(f"{CONSOLE}/nodes").text
        assert "Drain idle-node" not in page
        assert c.post(f"{CONSOLE}/nodes/idle-node/drain", data={"csrf": csrf_of(page)}).status_code == 403


def test_the_usage_page_shows_each_tenants_room_and_usage(cluster):
    with cluster.api() as api:
        r = api.post("/api/ai/quotas", json={"tenant": "team-a", "max_gpus": 4, "max_cpu": 16})
        assert r.status_code == 200, r.text
        room = r.json()["room"]
    with signed_in(cluster) as c:
        page = c.get(f"{CONSOLE}/usage?tenant=team-a")
        assert page.status_code == 200 and 'data-testid="quota-room"' in page.text
        assert f"gpus {room['gpus']}" in page.text and f"cpu {room['cpu']}" in page.text
        assert "memory_gib unlimited" in page.text
        assert "No calls recorded in the last 7 days for team-a" in page.text
        assert 'aria-current="page"' in page.text


def test_the_usage_page_shows_the_ledgers_records_with_their_cost(cluster):
    """Calls written by the gateway's own ledger writer into fabricd's store show on the page
    with their tokens and the cost the price sheet gives them."""
    store = open_store(f"sqlite://{cluster.server.state_dir}/fabric.db")  # fabricd's store (SQLite, WAL)
    ledger = UsageLedger(store, "gw-console-test")
    # an endpoint with no deployment behind it: no GPU-seconds, so the cost is the tokens' alone
    dims = Dims("team-u", "key-u", "usage-ep", "m-usage", None, "ok")
    now = time.time()
    ledger.record(Call(now, dims, 1000, 500, 200))
    ledger.record(Call(now, dims, 3000, 1500, 0))
    ledger.record(Call(now, Dims("team-v", "key-v", "usage-ep", "m-usage", None, "ok"), 10, 5, 0))
    ledger.close()  # a clean stop writes what is queued
    store.close()
    with cluster.api() as api:
        r = api.put("/api/ai/prices", json={"gpu_hour": 0, "models": {
            "m-usage": {"input_per_mtok": 2.0, "output_per_mtok": 8.0, "cached_per_mtok": 1.0}}})
        assert r.status_code == 200, r.text
    with signed_in(cluster) as c:
        page = c.get(f"{CONSOLE}/usage?tenant=team-u")
    assert page.status_code == 200 and 'data-testid="usage-rows"' in page.text
    # (3800 uncached input at 2 + 200 cached at 1 + 2000 output at 8) / 1e6
    cost = f"{(3800 * 2 + 200 * 1 + 2000 * 8) / 1e6:.4f}"
    totals = page.text.split('data-testid="usage-totals"')[1].split("</table>")[0]
    assert f"<td>team-u</td><td>2</td><td>6000</td><td>0.0</td><td>{cost}</td>" in totals
    assert "team-v" not in page.text  # the page's tenant filter
    rows = page.text.split('data-testid="usage-rows"')[1].split("</table>")[0]
    assert (f"<td>team-u</td><td>m-usage</td><td>2</td><td>4000</td><td>2000</td><td>200</td><td>0.0</td>"
            f"<td>{cost}</td>") in rows
