"""Only an admin creates, changes or deletes an endpoint with outbound reach (an external provider
or fallbacks), on every path that writes endpoints: the REST API, apply, restore (the console
writes through the REST API). A cluster-wide operator could otherwise point an external endpoint
at its own URL with another team's provider key file and receive that key in the Authorization
header of the gateway's forwarded call. The refusal never names the key file."""

from __future__ import annotations

from common.schemas import InferenceEndpoint
from controlplane.backup.document import RestorePlan
from controlplane.ops import backup as backup_ops
from controlplane.tenancy.principal import Principal

KEY_FILE = "/etc/fabric/provider-keys/team-b-secret-key"


def _external(name: str) -> dict:
    return {"name": name, "deployment": "unused", "external": {
        "url": "http://127.0.0.1:9/v1", "model": "m", "keys": [{"file": KEY_FILE}]}}


def _refused(resp) -> None:
    assert resp.status_code == 403, resp.text
    assert resp.json()["error"]["code"] == "forbidden"
    assert "admin" in resp.json()["error"]["message"]
    assert KEY_FILE not in resp.text and "team-b-secret-key" not in resp.text


def test_a_cluster_wide_operator_may_not_create_an_external_endpoint(tenancy_fabricd, tokens):
    with tenancy_fabricd.client(tokens["operator"]) as op, tenancy_fabricd.client(tokens["admin"]) as admin:
        _refused(op.post("/api/ai/endpoints", json=_external("ext-by-operator")))
        assert op.get("/api/ai/endpoints/ext-by-operator").status_code == 404  # nothing stored
        made = admin.post("/api/ai/endpoints", json=_external("ext-by-admin"))
        assert made.status_code == 201, made.text
        # Deleting it (and so re-creating it under another URL) is the admin's too.
        _refused(op.delete("/api/ai/endpoints/ext-by-admin"))
        assert admin.get("/api/ai/endpoints/ext-by-admin").status_code == 200
        assert admin.delete("/api/ai/endpoints/ext-by-admin").status_code == 200


def test_a_cluster_wide_operator_may_not_give_an_endpoint_fallbacks(tenancy_fabricd, tokens):
    with tenancy_fabricd.client(tokens["operator"]) as op, tenancy_fabricd.client(tokens["admin"]) as admin:
        assert admin.post("/api/ai/endpoints", json=_external("ext-fb")).status_code == 201
        for body in ({"name": "m-fb", "source": "hf://Qwen/Qwen3-8B"},):
            assert admin.post("/api/ai/models", json=body).status_code == 201
        assert admin.post("/api/ai/profiles", json={"name": "p-fb", "runtime": "vllm", "gpu": {"count": 1, "vram_gib": 24},
                                                    "cpu": 8, "memory_gib": 32}).status_code == 201
        assert admin.post("/api/ai/deployments", json={"name": "d-fb", "model": "m-fb", "profile": "p-fb",
                                                       "replicas": 0}).status_code == 201
        local = {"name": "ep-fb", "deployment": "d-fb", "fallbacks": ["ext-fb"]}
        _refused(op.post("/api/ai/endpoints", json=local))
        # The same endpoint without fallbacks is the operator's to make.
        plain = op.post("/api/ai/endpoints", json={"name": "ep-plain", "deployment": "d-fb"})
        assert plain.status_code == 201, plain.text
        assert admin.post("/api/ai/endpoints", json=local).status_code == 201


def test_apply_and_restore_refuse_an_operators_external_endpoint(tenancy_fabricd, tokens):
    doc = {"apiVersion": "fabric/v1", "kind": "InferenceEndpoint", "metadata": {"name": "ext-applied"},
           "spec": {k: v for k, v in _external("ext-applied").items() if k != "name"}}
    with tenancy_fabricd.client(tokens["operator"]) as op, tenancy_fabricd.client(tokens["admin"]) as admin:
        refused = op.post("/api/ai/apply", json={"documents": [doc]})
        assert refused.status_code == 403 and KEY_FILE not in refused.text
        applied = admin.post("/api/ai/apply", json={"documents": [doc]})
        assert applied.status_code == 200 and applied.json()["results"][0]["action"] == "created", applied.text
        dump = admin.post("/api/ai/backup").json()
        assert admin.delete("/api/ai/endpoints/ext-applied").status_code == 200
        refused = op.post("/api/ai/restore", params={"apply": "true"}, json=dump)
        assert refused.status_code == 403 and KEY_FILE not in refused.text
        assert admin.get("/api/ai/endpoints/ext-applied").status_code == 404
        restored = admin.post("/api/ai/restore", params={"apply": "true", "replace": "true"}, json=dump)
        assert restored.status_code == 200, restored.text
        assert admin.get("/api/ai/endpoints/ext-applied").status_code == 200


def test_restore_checks_the_writer_itself_not_only_the_route_rule():
    """Restore (controlplane.ops.backup) calls the same refusal as the create route, so a rule loosened
    later still holds."""
    record = InferenceEndpoint.model_validate(_external("ext-r")).model_dump(mode="json")
    plan = RestorePlan(records={("endpoints", "ext-r"): record})
    try:
        backup_ops.check(Principal("op", "operator"), plan)
    except Exception as exc:  # noqa: BLE001 - the type is asserted below
        assert getattr(exc, "code", None) == "forbidden" and KEY_FILE not in str(exc)
    else:
        raise AssertionError("an operator's external endpoint was accepted by restore")
    backup_ops.check(Principal("root", "admin"), plan)  # an admin's passes


def test_the_console_has_no_endpoint_write_of_its_own():
    """The console's writes are REST API calls with the user's token (controlplane.console.backend);
    none of them writes an endpoint, so the API's rule above is the console's too."""
    from controlplane.console.actions import router

    writes = [r.path for r in router.routes if "POST" in getattr(r, "methods", set())]
    assert writes and not any("endpoint" in p or "apply" in p or "restore" in p for p in writes)
