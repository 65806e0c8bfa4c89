"""Admission: would this deployment be accepted? The tenant policy and quota checks of deployment
create and scale, run on a plain JSON deployment body or a Kubernetes AdmissionReview.

An AdmissionReview (admission.k8s.io/v1) from a ValidatingWebhookConfiguration carries
``request.uid``, ``request.operation`` and ``request.object``: an InferenceDeployment custom
resource whose ``metadata.name`` is the name and whose ``spec`` holds model, profile, replicas
and tenant (``spec.tenant``, else ``metadata.labels["fabric/tenant"]``). The answer is the same
AdmissionReview with ``response.uid`` (echoed), ``response.allowed`` and, when refused,
``response.status`` {code 403, message naming every reason}. DELETE and CONNECT are always
allowed. An UPDATE counts the GPUs of the deployment's current replicas as already held.
A plain body answers {"allowed", "reasons", "name"}. ``review`` reads the store and decides;
nothing is written.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pydantic import ValidationError

from common.errors import InvalidInput
from common.records import deployments
from common.records.kinds import BY_KIND
from common.schemas import InferenceDeployment
from common.store.base import Store
from controlplane.tenancy import policies, quotas
from controlplane.tenancy.principal import ADMIN, Principal, visible

REVIEW_API = "admission.k8s.io/v1"
TENANT_LABEL = "fabric/tenant"
ALWAYS_ALLOWED = frozenset({"DELETE", "CONNECT"})


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    reasons: tuple[str, ...]
    name: str | None = None


def from_resource(obj: dict) -> dict:
    """A deployment body from an InferenceDeployment custom resource (metadata + spec)."""
    if not isinstance(obj, dict):
        raise InvalidInput("request.object: expected an InferenceDeployment resource")
    metadata, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    if not isinstance(metadata, dict) or not isinstance(spec, dict):
        raise InvalidInput("request.object: metadata and spec must be objects")
    labels = metadata.get("labels") or {}
    tenant = spec.get("tenant") or (labels.get(TENANT_LABEL) if isinstance(labels, dict) else None)
    return {**spec, "name": metadata.get("name"), "tenant": tenant}


def _sees(who: Principal | None, kind: str, record: dict | None) -> bool:
    """Does the caller (None: the webhook, cluster-wide) see the stored ``record``?"""
    return record is not None and (who is None or visible(who, kind, record.get("tenant")))


def review(store: Store, body: dict, who: Principal | None = None) -> Verdict:
    """Every reason the deployment would be refused (policy, quota, missing references). For a
    tenant-bound caller another tenant's model or profile reads as missing, and another tenant's
    deployment of the same name as absent, so the answer says nothing of other tenants."""
    try:
        dep = InferenceDeployment.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        return Verdict(False, (f"{where or 'body'}: {first.get('msg', 'invalid')}",), body.get("name"))
    unseen = [(kind, ref) for kind, ref in (("model", dep.model), ("profile", dep.profile))
              if not _sees(who, kind, BY_KIND[kind].stored(store, ref))]
    reasons = [f"{kind} {ref!r} does not exist" for kind, ref in unseen]
    judged = policies.deploy_of(store, dep.tenant, dep.model, capacity_class=dep.capacity_class)
    if ("model", dep.model) in unseen:  # another tenant's model is judged as an absent one: no source
        judged = replace(judged, source=None)
    reasons += policies.refusals(policies.load(store, dep.tenant), judged, admin=who is not None and who.role == ADMIN)
    current = deployments.stored(store, dep.name)
    before = int(current.get("replicas", 0)) if _sees(who, "deployment", current) else 0
    refusal = quotas.check_deployment_change(store, dep.name, dep.tenant, dep.profile, before, dep.replicas)
    if refusal is not None:
        reasons.append(refusal.message)
    return Verdict(not reasons, tuple(reasons), dep.name)


def is_review(body: dict) -> bool:
    return body.get("kind") == "AdmissionReview"


def review_request(body: dict) -> tuple[str, str, dict | None]:
    """(uid, operation, deployment body or None for an always-allowed operation)."""
    if body.get("apiVersion") != REVIEW_API:
        raise InvalidInput(f"apiVersion: an AdmissionReview must be {REVIEW_API}, not {body.get('apiVersion')!r}")
    request = body.get("request")
    if not isinstance(request, dict) or not isinstance(request.get("uid"), str) or not request["uid"]:
        raise InvalidInput("request.uid: an AdmissionReview needs request.uid (a string) to answer")
    operation = str(request.get("operation", "CREATE")).upper()
    if operation in ALWAYS_ALLOWED:
        return request["uid"], operation, None
    return request["uid"], operation, from_resource(request.get("object"))


def review_response(uid: str, verdict: Verdict) -> dict:
    response: dict = {"uid": uid, "allowed": verdict.allowed}
    if not verdict.allowed:
        response["status"] = {"code": 403, "reason": "Forbidden", "message": "; ".join(verdict.reasons)}
    return {"apiVersion": REVIEW_API, "kind": "AdmissionReview", "response": response}
