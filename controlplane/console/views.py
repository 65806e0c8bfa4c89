"""Pure shaping of API answers into what the templates draw (no I/O; unit-tested)."""

from __future__ import annotations

from collections import defaultdict


def _pct(part: float, whole: float) -> int:
    return 0 if whole <= 0 else max(0, min(100, round(100 * part / whole)))


def capacity_strip(capacity: dict) -> list[dict]:
    """Free/total GPUs, CPU and memory over every node, each with the used share in percent."""
    nodes = capacity.get("nodes", [])
    rows = [
        ("GPUs", capacity.get("gpus_free", 0), capacity.get("gpus_total", 0), ""),
        ("CPU", sum(n.get("cpu_free", 0) for n in nodes), sum(n.get("cpu_allocatable", 0) for n in nodes), " cores"),
        ("Memory", round(sum(n.get("memory_free_gib", 0) for n in nodes), 1),
         round(sum(n.get("memory_allocatable_gib", 0) for n in nodes), 1), " GiB"),
    ]
    return [{"label": label, "free": free, "total": total, "unit": unit, "used_pct": _pct(total - free, total)}
            for label, free, total, unit in rows]


def replicas_by_revision(replicas: list[dict]) -> list[dict]:
    """[{revision, replicas, ready}] newest revision first."""
    groups: dict[int, list[dict]] = defaultdict(list)
    for r in replicas:
        groups[int(r.get("revision", 1))].append(r)
    return [{"revision": rev, "replicas": sorted(groups[rev], key=lambda r: r.get("ordinal", 0)),
             "ready": sum(1 for r in groups[rev] if r.get("ready"))}
            for rev in sorted(groups, reverse=True)]


def weight_bars(routing: dict) -> list[dict]:
    """One bar per replica of an explain-routing answer: weight, share of the largest, reason."""
    entries = routing.get("replicas", [])
    top = max((float(e.get("weight") or 0) for e in entries), default=0.0)
    total = sum(float(e.get("weight") or 0) for e in entries if e.get("included"))
    return [{"replica_id": e.get("replica_id", ""), "weight": e.get("weight") or 0,
             "included": bool(e.get("included")), "reason": e.get("reason", ""),
             "maglev": bool(e.get("maglev")), "width_pct": _pct(float(e.get("weight") or 0), top),
             "share_pct": _pct(float(e.get("weight") or 0), total) if e.get("included") else 0}
            for e in entries]


def gateway_base(endpoint: str, gateway: str = "") -> str:
    """The endpoint's OpenAI base_url on the gateway (FABRIC_CONSOLE_GATEWAY_URL), or its path there when
    fabricd was not told the gateway's address."""
    return f"{gateway}/api/ai/openai/{endpoint}/v1"


def rollout_state(ro: dict) -> str:
    """Where a rollout stands, in words: a finished one says how it ended (never "Succeeded,
    step 1 of 2"), a running canary which step of how many it is on (steps count from 1)."""
    phase, steps = ro.get("phase", ""), ro.get("steps") or []
    if phase == "Succeeded":
        return f"Succeeded: rev {ro.get('to_revision')} serves all traffic"
    if phase == "RolledBack":
        return f"RolledBack: rev {ro.get('from_revision')} serves all traffic"
    if steps:
        return f"{phase}, step {min(int(ro.get('step') or 0) + 1, len(steps))} of {len(steps)}"
    return phase


def supply_chain_checks(body: dict) -> list[dict]:
    """What the model supply chain (agent/models/checks.py, jobs.py) will check for this model,
    in words, from the body the form would send: [{check, detail, on}]."""
    src = str(body.get("source", ""))
    pinned = src.startswith("hf://") and "@" in src
    where = ("downloaded from the Hugging Face hub (or HF_ENDPOINT's mirror)" if src.startswith("hf://")
             else "copied from a local path under FABRIC_MODEL_DIR")
    rows = [
        ("source", f"{src or '(none)'}: {where}" + ("" if pinned or not src.startswith("hf://")
                                                    else "; not pinned: the branch's newest commit"), True),
        ("scan", "refuses pickle formats (.pkl, .pickle, .pt, .pth), symlinks, special files, names leaving "
                 "the model directory, more than FABRIC_MODEL_MAX_FILES files", True),
        ("digest", "SHA-256 of the sorted manifest (path, size, sha256 of every file), shown on the model", True),
        ("checksum", f"must equal {body['digest']}" if body.get("digest") else "no expected digest given",
         bool(body.get("digest"))),
        ("require digest", "Ready only with a matching expected digest" if body.get("require_checksum")
         else "off", bool(body.get("require_checksum"))),
        ("license", f"recorded: {body['license']}" if body.get("license") else "none recorded",
         bool(body.get("license"))),
        ("residency", f"replicas placed only on nodes of site/region {body['residency']}" if body.get("residency")
         else "any site", bool(body.get("residency"))),
    ]
    for a in body.get("adapters") or []:
        rows.append((f"adapter {a.get('name')}", f"{a.get('source')}: scanned and digested as the model", True))
    return [{"check": c, "detail": d, "on": on} for c, d, on in rows]


def snippets(gateway: str, endpoint: str, model: str) -> dict:
    """The playground's call as curl and the openai client would make it; the key is a
    placeholder ($FABRIC_API_KEY), never a real secret."""
    base = f"{gateway}/api/ai/openai/{endpoint}/v1"
    curl = (f"curl -N {base}/chat/completions \\\n  -H \"Authorization: Bearer $FABRIC_API_KEY\" \\\n"
            f"  -H 'content-type: application/json' \\\n"
            f"  -d '{{\"model\": \"{model}\", \"stream\": true, \"messages\": [{{\"role\": \"user\", "
            f"\"content\": \"Hello\"}}]}}'")
    py = ("import os\nfrom openai import OpenAI\n\n"
          f"client = OpenAI(base_url=\"{base}\", api_key=os.environ[\"FABRIC_API_KEY\"])\n"
          f"for chunk in client.chat.completions.create(model=\"{model}\", stream=True,\n"
          "        messages=[{\"role\": \"user\", \"content\": \"Hello\"}]):\n"
          "    if chunk.choices:\n        print(chunk.choices[0].delta.content or \"\", end=\"\")\n")
    return {"curl": curl, "openai": py}
