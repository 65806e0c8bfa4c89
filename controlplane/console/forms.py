"""The console's forms for the everyday writes: each posts to the REST API route fabricctl uses.

    GET/POST /app/ai/models/new                     POST /api/ai/models (a dry run: ?dry_run=true, the same checks)
    GET/POST /app/ai/profiles/new                   POST /api/ai/profiles
    GET/POST /app/ai/deployments/new                POST /api/ai/deployments
    GET/POST /app/ai/endpoints/new                  POST /api/ai/endpoints
    POST     /app/ai/deployments/{name}/autoscaling PUT  /api/ai/deployments/{name}/autoscaling
    POST     /app/ai/deployments/{name}/rollouts    POST .../revisions (when model/profile change), then .../rollouts
    POST     /app/ai/deployments/{name}/rollouts/{id}/{action}  pause | resume | promote | rollback

Each write goes through actions._guarded (session, then CSRF) and then the API with the
operator's own token; a refusal re-renders the form with the API's message next to the field it
names (a 422's `fields`, or a message starting "body.FIELD:" / "FIELD:"), or above the form when
it names none. The form's own parsing only turns text into JSON types (a number that is not one
is refused here, naming its field); every rule stays in the API.
"""

from __future__ import annotations

import asyncio
import re
from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from common.runtimes import OPENAI_INCAPABLE, RUNTIME_NAMES
from common.schemas import (
    ROUTING_L7,
    ROUTING_STRATEGIES,
    AutoscalingSpec,
    InferenceDeployment,
    InferenceEndpoint,
    InferenceProfile,
    ModelArtifact,
)
from controlplane.console import charts, views
from controlplane.console.actions import _failed, _guarded
from controlplane.console.backend import Api, ApiError
from controlplane.console.render import PREFIX, page, session_of, to_login
from controlplane.console.schema_form import FormField, fields_of

router = APIRouter(prefix=PREFIX, include_in_schema=False)


# Forms read the API's own models (schema_form.fields_of): a field added there shows up here.
MODEL_FIELDS = [
    *fields_of(ModelArtifact, skip={"adapters"}, labels={"digest": "Expected digest",
                                                         "require_checksum": "Require the digest"}),
    FormField("revision", "Revision", hint="an hf:// commit or tag to pin (appended as @REVISION)"),
    FormField("adapters", "LoRA adapters", "textarea", hint="one per line: NAME=SOURCE"),
]
PROFILE_FIELDS = fields_of(InferenceProfile, choices={
    # The runtimes the API accepts, from the one runtime table (common/runtimes.py): they cannot drift.
    "runtime": [r for r in RUNTIME_NAMES if r not in OPENAI_INCAPABLE]},
    labels={"gpu.count": "GPUs per replica", "gpu.vram_gib": "VRAM per GPU (GiB)", "cpu": "vCPUs"})
DEPLOYMENT_FIELDS = fields_of(InferenceDeployment, skip={"revision", "autoscaling"},
                              choices={"model": [], "profile": []})
ENDPOINT_FIELDS = fields_of(InferenceEndpoint, skip={"external"}, choices={
    "deployment": [], "routing": list(ROUTING_STRATEGIES), "routing_l7": list(ROUTING_L7)},
    labels={"routing_l7": "Gateway routing"})
AUTOSCALING_FIELDS = fields_of(AutoscalingSpec)
ROLLOUT_FIELDS = [
    FormField("model", "Model", "select", hint="the new revision's model (unchanged: the newest revision's)"),
    FormField("profile", "Profile", "select"),
    FormField("strategy", "Strategy", "select", options=["rolling", "canary", "blue-green"], default="rolling"),
    FormField("canary_percent", "Canary share (%)", "number", hint="canary only: one step at this share, then 100",
              integer=True),
    FormField("reason", "Reason", hint="kept with the revision"),
]


def field_errors(exc: ApiError, names: list[str]) -> tuple[dict[str, str], str]:
    """({form field: message}, message for no field) from an API refusal."""
    out: dict[str, str] = {}
    for f in exc.fields:
        name = str(f.get("field", ""))
        best = next((n for n in names if name == n or name.startswith(n + ".") or n.startswith(name + ".")), None)
        if best is None and "." in name:  # adapters.0.source -> adapters
            best = next((n for n in names if name.split(".")[0] == n), None)
        if best:
            out.setdefault(best, str(f.get("message", "invalid")))
    if out:
        return out, "" if len(exc.fields) == len(out) else exc.message
    m = re.match(r"^(?:body\.)?([a-z_][a-z0-9_.]*): (.*)$", exc.message, re.S)
    if m:
        name = m.group(1)
        best = next((n for n in names if name == n or name.startswith(n + ".")), None)
        if best:
            return {best: m.group(2)}, ""
    return {}, f"{exc.status} {exc.code}: {exc.message}"


def _set(body: dict, dotted: str, value) -> None:
    *parents, leaf = dotted.split(".")
    for p in parents:
        body = body.setdefault(p, {})
    body[leaf] = value


def to_body(fields: list[FormField], form: dict) -> tuple[dict, dict[str, str]]:
    """Form text -> JSON body (blank optional fields left out), and {field: why} for numbers
    that are not numbers. A checkbox the form did not carry at all (not even its hidden "off")
    is left to the API's default."""
    body: dict = {}
    bad: dict[str, str] = {}
    for f in fields:
        raw = form.get(f.name, "").strip()
        if f.kind == "checkbox":
            if f.name in form:
                _set(body, f.name, raw in ("on", "true", "1"))
            continue
        if raw == "":
            continue
        if f.kind == "number":
            try:
                value = int(raw) if f.integer else float(raw)
            except ValueError:
                bad[f.name] = "expected a whole number" if f.integer else "expected a number"
                continue
            _set(body, f.name, value)
        elif f.lines:
            _set(body, f.name, [line.strip() for line in raw.splitlines() if line.strip()])
        else:
            _set(body, f.name, raw)
    return body, bad


def model_body(form: dict) -> tuple[dict, dict[str, str]]:
    body, bad = to_body(MODEL_FIELDS, form)
    rev = body.pop("revision", None)
    if rev and str(body.get("source", "")).startswith("hf://"):
        body["source"] = f"{body['source'].split('@')[0]}@{rev}"
    elif rev:
        bad["revision"] = "a revision pins an hf:// source only"
    adapters = []
    for i, line in enumerate(text.strip() for text in str(body.pop("adapters", "")).splitlines()):
        if not line:
            continue
        name, sep, src = line.partition("=")
        if not sep or not name.strip() or not src.strip():
            bad["adapters"] = f"line {i + 1}: expected NAME=SOURCE"
            break
        adapters.append({"name": name.strip(), "source": src.strip()})
    if adapters:
        body["adapters"] = adapters
    if not body.get("require_checksum"):
        body.pop("require_checksum", None)
    return body, bad


FORMS = {  # key -> (title, fields, API path, what the API call creates, return page)
    "models": ("Add a model", MODEL_FIELDS, "/api/ai/models", "model", "models"),
    "profiles": ("Add a profile", PROFILE_FIELDS, "/api/ai/profiles", "profile", "profiles"),
    "deployments": ("Deploy a model", DEPLOYMENT_FIELDS, "/api/ai/deployments", "deployment", "deployments"),
    "endpoints": ("Expose an endpoint", ENDPOINT_FIELDS, "/api/ai/endpoints", "endpoint", "endpoints"),
}


async def _options(api: Api, key: str) -> dict[str, list[str]]:
    if key == "deployments" or key == "rollout":
        models, profiles = await api.get("/api/ai/models"), await api.get("/api/ai/profiles")
        return {"model": [m["name"] for m in models], "profile": [p["name"] for p in profiles]}
    if key == "endpoints":
        return {"deployment": [d["name"] for d in await api.get("/api/ai/deployments")]}
    return {}


def _form_page(request, session, key: str, values: dict, errors: dict, general: str, options: dict,
               status: int = 200, checks: list | None = None, dry_ok: bool = False):
    title, fields, _path, _what, active = FORMS[key]
    return page(request, "form.html", session, status=status, active=active, title=title, key=key,
                fields=fields, values=values, errors=errors, general=general, options=options,
                action=f"{PREFIX}/{key}/new", checks=checks, dry_ok=dry_ok, dry_run=key == "models")


def _new_page(key: str):
    async def show(request: Request):
        session = session_of(request)
        if session is None:
            return to_login()
        api = Api(request, session)
        try:
            options = await _options(api, key)
        except ApiError as exc:
            return _failed(request, session, FORMS[key][4], exc)
        values = {f.name: f.default for f in FORMS[key][1]}
        values.update({k: v for k, v in request.query_params.items() if k in values})
        return _form_page(request, session, key, values, {}, "", options)
    return show


def _submit(key: str):
    async def submit(request: Request):
        session, form, refused = await _guarded(request)
        if refused is not None:
            return refused
        title, fields, path, what, active = FORMS[key]
        api = Api(request, session)
        try:
            options = await _options(api, key)
        except ApiError as exc:
            return _failed(request, session, active, exc)
        body, bad = model_body(form) if key == "models" else to_body(fields, form)
        values = {f.name: form.get(f.name, "") for f in fields}
        if bad:
            return _form_page(request, session, key, values, bad, "", options, status=422)
        dry = key == "models" and "dry_run" in form
        try:
            await api.call("POST", path, json=body, params={"dry_run": "true"} if dry else None)
        except ApiError as exc:
            errors, general = field_errors(exc, [f.name for f in fields])
            return _form_page(request, session, key, values, errors, general, options, status=exc.status,
                              checks=views.supply_chain_checks(body) if key == "models" else None)
        if dry:
            return _form_page(request, session, key, values, {}, "", options,
                              checks=views.supply_chain_checks(body), dry_ok=True)
        name = body.get("name", "")
        msg = quote(f"{what} {name} created")
        target = f"{PREFIX}/{active}/{quote(name, safe='')}" if key in ("deployments", "endpoints") else \
            f"{PREFIX}/{active}"
        return RedirectResponse(f"{target}?message={msg}", status_code=303)
    return submit


for _key in FORMS:
    router.add_api_route(f"/{_key}/new", _new_page(_key), methods=["GET"], response_class=HTMLResponse)
    router.add_api_route(f"/{_key}/new", _submit(_key), methods=["POST"])


def _back(name: str, message: str) -> RedirectResponse:
    return RedirectResponse(f"{PREFIX}/deployments/{quote(name, safe='')}?message={quote(message)}", status_code=303)


async def deployment_context(api: Api, name: str) -> dict:
    """Everything the deployment page draws (pages.deployment, and these forms' page when they refuse)."""
    q = quote(name, safe="")
    dep, replicas = await asyncio.gather(api.get(f"/api/ai/deployments/{q}"), api.get("/api/ai/replicas"))
    rollouts, placement, scaling, events, models, profiles = await asyncio.gather(
        api.maybe(f"/api/ai/deployments/{q}/rollouts", []), api.maybe(f"/api/ai/explain/placement/{q}"),
        api.maybe(f"/api/ai/explain/scaling/{q}"), api.maybe(f"/api/ai/events?object=deployment/{q}&limit=30", []),
        api.maybe("/api/ai/models", []), api.maybe("/api/ai/profiles", []))
    mine = [r for r in replicas if r.get("deployment") == name]
    auto = dep.get("autoscaling") or {}
    auto_values = {k: ("on" if v is True else "" if v is False else str(v)) for k, v in auto.items()}
    return {"d": dep, "revisions": views.replicas_by_revision(mine),
            "rollouts": rollouts if isinstance(rollouts, list) else [], "placement": placement,
            "scaling": scaling, "events": events or [], "charts": charts.deployment_charts(name),
            "autoscaling_fields": AUTOSCALING_FIELDS, "rollout_fields": ROLLOUT_FIELDS,
            "autoscaling_values": auto_values or {f.name: f.default for f in AUTOSCALING_FIELDS},
            "rollout_values": {"strategy": "rolling"}, "autoscaling_errors": {}, "rollout_errors": {},
            "autoscaling_general": "", "rollout_general": "",
            "options": {"model": [m["name"] for m in models or []], "profile": [p["name"] for p in profiles or []]},
            "message": ""}


async def _detail_with_errors(request, session, name: str, exc: ApiError, which: str, form: dict):
    fields = AUTOSCALING_FIELDS if which == "autoscaling" else ROLLOUT_FIELDS
    errors, general = field_errors(exc, [f.name for f in fields])
    try:
        ctx = await deployment_context(Api(request, session), name)
    except ApiError as gone:
        return _failed(request, session, "deployments", gone)
    ctx[f"{which}_errors"], ctx[f"{which}_general"] = errors, general
    ctx[f"{which}_values"] = {f.name: form.get(f.name, "") for f in fields}
    return page(request, "deployment.html", session, status=exc.status, active="deployments", **ctx)


@router.post("/deployments/{name}/autoscaling")
async def set_autoscaling(request: Request, name: str):
    session, form, refused = await _guarded(request)
    if refused is not None:
        return refused
    body, bad = to_body(AUTOSCALING_FIELDS, form)
    try:
        if bad:
            raise ApiError(422, "invalid", "", [{"field": k, "message": v} for k, v in bad.items()])
        await Api(request, session).call("PUT", f"/api/ai/deployments/{quote(name, safe='')}/autoscaling", json=body)
    except ApiError as exc:
        return await _detail_with_errors(request, session, name, exc, "autoscaling", form)
    return _back(name, f"autoscaling of {name} set: {body.get('min_replicas', 1)}-{body.get('max_replicas', 4)} "
                       f"replicas{'' if body.get('enabled') else ' (disabled)'}")


@router.post("/deployments/{name}/rollouts")
async def start_rollout(request: Request, name: str):
    session, form, refused = await _guarded(request)
    if refused is not None:
        return refused
    body, bad = to_body(ROLLOUT_FIELDS, form)
    api, dep = Api(request, session), quote(name, safe="")
    try:
        if bad:
            raise ApiError(422, "invalid", "", [{"field": k, "message": v} for k, v in bad.items()])
        rev = {k: body[k] for k in ("model", "profile", "reason") if body.get(k)}
        if rev.keys() - {"reason"}:
            try:
                await api.call("POST", f"/api/ai/deployments/{dep}/revisions", json=rev)
            except ApiError as exc:
                if exc.code != "unchanged":  # the newest revision already is that template
                    raise
        ro = {"strategy": body.get("strategy", "rolling")}
        if body.get("canary_percent") is not None:
            ro["canary_percent"] = body["canary_percent"]
        started = await api.call("POST", f"/api/ai/deployments/{dep}/rollouts", json=ro)
    except ApiError as exc:
        return await _detail_with_errors(request, session, name, exc, "rollout", form)
    return _back(name, f"rollout {started.get('id')} of {name} started: {started.get('strategy')} to revision "
                       f"{started.get('to_revision')}")


@router.post("/deployments/{name}/rollouts/{rollout_id}/{action}")
async def operate_rollout(request: Request, name: str, rollout_id: int, action: str):
    session, _, refused = await _guarded(request)
    if refused is not None:
        return refused
    try:
        await Api(request, session).call(
            "POST", f"/api/ai/deployments/{quote(name, safe='')}/rollouts/{rollout_id}/{quote(action, safe='')}")
    except ApiError as exc:
        return _failed(request, session, "deployments", exc)
    return _back(name, f"rollout {rollout_id} of {name}: {action} sent")
