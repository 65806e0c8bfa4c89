"""Declarative apply/get/delete through the real fabricctl against a real fabricd: the example
documents, create-or-update with the server's diff, --dry-run, get -o yaml round trips for every
kind, refusals that name the document and field, delete -f in dependency order."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.controlplane.conftest import BIN, login, start_fabricd

EXAMPLE = Path(__file__).parents[2] / "docs" / "examples" / "demo-llm.yaml"
KINDS = [("models", "demo-llm"), ("profiles", "lab-h100"), ("deployments", "demo-llm"),
         ("endpoints", "demo-llm-openai")]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("apply")
    with start_fabricd(tmp) as server:
        e = {k: v for k, v in os.environ.items() if not k.startswith("FABRIC_")}
        e.update(FABRIC_URL=server.url, FABRIC_TOKEN=login(server), XDG_CONFIG_HOME=str(tmp / "xdg"))
        yield e


def ctl(env, *args, rc=0, stdin=None):
    proc = subprocess.run([str(BIN / "fabricctl"), "ai", *args], capture_output=True, text=True, env=env,
                          timeout=60, input=stdin)
    assert proc.returncode == rc, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    return proc


def test_apply_get_round_trip_update_dry_run_and_delete(env, tmp_path):
    out = ctl(env, "apply", "-f", str(EXAMPLE)).stdout.splitlines()
    assert out == ["modelartifact/demo-llm created", "inferenceprofile/lab-h100 created",
                   "inferencedeployment/demo-llm created", "inferenceendpoint/demo-llm-openai created"]
    assert all(line.endswith(" unchanged") for line in ctl(env, "apply", "-f", str(EXAMPLE)).stdout.splitlines())

    # get -o yaml of every kind applies back unchanged (through stdin, and as a directory of files).
    for i, (kind, name) in enumerate(KINDS):
        text = ctl(env, "get", kind, name, "-o", "yaml").stdout
        doc = yaml.safe_load(text)
        assert doc["metadata"]["name"] == name and "created_at" not in doc["spec"]
        assert ctl(env, "apply", "-f", "-", stdin=text).stdout.strip().endswith(f"/{name} unchanged")
        (tmp_path / f"{i}-{kind}.yaml").write_text(text)
    assert ctl(env, "apply", "-f", str(tmp_path)).stdout.count(" unchanged") == 4
    listed = ctl(env, "get", "deploy", "-o", "yaml").stdout
    assert [d["kind"] for d in yaml.safe_load_all(listed)] == ["InferenceDeployment"]
    assert ctl(env, "get", "ep", "-o", "name").stdout.split() == ["inferenceendpoint/demo-llm-openai"]

    # An update: the server's diff, first as a dry run (nothing written), then for real.
    edited = EXAMPLE.read_text().replace("replicas: 3", "replicas: 5").replace("least_queue", "lowest_ttft")
    (tmp_path / "edited.yaml").write_text(edited)
    dry = ctl(env, "apply", "-f", str(tmp_path / "edited.yaml"), "--dry-run").stdout
    assert "inferencedeployment/demo-llm updated (dry run)\n  replicas: 3 -> 5" in dry
    assert "routing: least_queue -> lowest_ttft" in dry
    assert "replicas: 3" in ctl(env, "get", "deployment", "demo-llm", "-o", "yaml").stdout
    ctl(env, "apply", "-f", str(tmp_path / "edited.yaml"))
    assert yaml.safe_load(ctl(env, "get", "deployments", "demo-llm", "-o", "yaml").stdout)["spec"]["replicas"] == 5
    assert ctl(env, "get", "endpoint", "demo-llm-openai", "-o", "json").stdout.count("lowest_ttft") == 1

    # What cannot change in place is refused before anything is written.
    (tmp_path / "bad.yaml").write_text(edited.replace("replicas: 5", "replicas: 2").replace("count: 1", "count: 2"))
    refused = ctl(env, "apply", "-f", str(tmp_path / "bad.yaml"), rc=1).stderr
    assert "InferenceProfile lab-h100: spec.gpu cannot change in place" in refused
    assert yaml.safe_load(ctl(env, "get", "deployment", "demo-llm", "-o", "yaml").stdout)["spec"]["replicas"] == 5

    out = ctl(env, "delete", "-f", str(EXAMPLE)).stdout.splitlines()
    assert out == ["inferenceendpoint/demo-llm-openai deleted", "inferencedeployment/demo-llm deleted",
                   "inferenceprofile/lab-h100 deleted", "modelartifact/demo-llm deleted"]
    assert ctl(env, "get", "models").stdout.strip() == "(none)"
    assert "not found (skipped)" in ctl(env, "delete", "-f", str(EXAMPLE)).stdout


def test_quota_and_autoscaling_kinds(env, tmp_path):
    ctl(env, "apply", "-f", str(EXAMPLE))
    tenant = EXAMPLE.with_name("tenant-acme.yaml")
    assert ctl(env, "apply", "-f", str(tenant)).stdout.splitlines() == [
        "modelartifact/acme-chat created", "inferencedeployment/acme-chat created", "tenantquota/acme created"]
    quota = ctl(env, "get", "quota", "acme", "-o", "yaml").stdout
    assert yaml.safe_load(quota)["spec"] == {"max_gpus": 4, "max_cpu": None, "max_memory_gib": None,
                                             "guaranteed_gpus": 0}
    assert ctl(env, "apply", "-f", "-", stdin=quota).stdout.strip() == "tenantquota/acme unchanged"
    assert "acme  max_gpus=4" in ctl(env, "get", "quotas").stdout
    edited = tenant.read_text().replace("max_gpus: 4", "max_gpus: 6").replace("max_replicas: 3", "max_replicas: 2")
    (tmp_path / "t.yaml").write_text(edited)
    out = ctl(env, "apply", "-f", str(tmp_path / "t.yaml")).stdout
    assert "tenantquota/acme updated\n  max_gpus: 4 -> 6" in out and "inferencedeployment/acme-chat updated" in out
    dep = yaml.safe_load(ctl(env, "get", "deployment", "acme-chat", "-o", "yaml").stdout)
    assert dep["metadata"] == {"name": "acme-chat", "tenant": "acme"} and dep["spec"]["autoscaling"]["max_replicas"] == 2
    assert "tenantquota/acme skipped" in ctl(env, "delete", "-f", str(tenant)).stdout
    ctl(env, "delete", "-f", str(EXAMPLE))


@pytest.mark.parametrize("text, words", [
    ("kind: Gadget\nmetadata: {name: x}\nspec: {}\n", "unknown kind 'Gadget'"),
    ("kind: ModelArtifact\nmetadata: {}\nspec: {source: /m}\n", "metadata.name is required"),
    ("kind: InferenceProfile\nmetadata: {name: p}\nspec: {gpu: {count: 9, vram_gib: 1}, cpu: 1, memory_gib: 1}\n",
     "spec.gpu.count: Input should be less than or equal to 8"),
    ("kind: ModelArtifact\nmetadata: {name: m}\nspec: {source: /m, status: {phase: Ready}}\n",
     "spec.status is set by the server"),
    ("kind: [unclosed\n", "not YAML"),
])
def test_bad_documents_are_refused_naming_the_document(env, tmp_path, text, words):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    proc = ctl(env, "apply", "-f", str(f), rc=2 if "YAML" in words else 1)
    assert words in proc.stderr and ("bad.yaml" in proc.stderr)
    assert ctl(env, "get", "models", "-o", "name").stdout.strip() == ""
