"""`fabricctl ai deployment history | revise | rollout ...`: revisions and rollouts.

    fabricctl ai deployment history NAME
    fabricctl ai deployment revise NAME [--model M] [--profile P] [--engine-arg A]... [--reason R]
    fabricctl ai deployment rollout NAME [--to-revision N] [--strategy rolling|canary|blue-green]
        [--canary-percent P | --steps 5:300,20:600,50:900,100] [--max-surge S] [--max-unavailable U]
        [--min-healthy-secs S] [--error-rate-max R] [--ttft-ms-max MS] [--rollback-window-secs S]
        [--auto-promote] [-w|--wait [--timeout S]]
    fabricctl ai deployment rollout status|pause|resume|promote|rollback NAME [-w]

`rollout` reads its first argument as an action when a deployment name follows it, else as the
deployment to roll out. -w follows the rollout until it Succeeded (exit 0) or RolledBack
(exit 1), printing each change of phase or message.
"""

from __future__ import annotations

import time

import typer

from fabricctl.output import col, emit_json, emit_object, emit_table, session

JSON_OPT = typer.Option(False, "--json", help="print JSON for scripts")
NAME_ARG = typer.Argument(..., metavar="NAME", help="a deployment")
ACTIONS = ("status", "pause", "resume", "promote", "rollback")
POLL_S = 2.0
HISTORY_COLUMNS = [
    col("REVISION", "revision"), col("MODEL", "template.model"), col("PROFILE", "template.profile"),
    ("ENGINE_ARGS", lambda r: " ".join(r.get("template", {}).get("engine_args", []))),
    ("CREATED", lambda r: time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["created_at"]))),
    col("WHO", "who"), col("REASON", "reason"),
    ("SUPERSEDED", lambda r: "yes" if r.get("superseded_at") else ""),
]


def parse_steps(text: str) -> list[dict]:
    """'5:300,20:600,50:900,100' -> [{"percent": 5, "secs": 300}, ..., {"percent": 100}]."""
    out = []
    for part in text.split(","):
        pct, _, secs = part.strip().partition(":")
        try:
            step = {"percent": int(pct)}
            if secs:
                step["secs"] = float(secs)
        except ValueError:
            raise typer.BadParameter(f"{part.strip()!r} is not PERCENT[:SECS]", param_hint="--steps") from None
        out.append(step)
    return out


def history(name: str = NAME_ARG, as_json: bool = JSON_OPT) -> None:
    """Every revision of a deployment: template, when, who, why."""
    with session() as c:
        emit_table(c.get(f"/api/ai/deployments/{name}/revisions"), HISTORY_COLUMNS, as_json)


def revise(name: str = NAME_ARG,
           model: str = typer.Option(None, "--model", help="the new revision's model (default: unchanged)"),
           profile: str = typer.Option(None, "--profile", help="the new revision's profile (default: unchanged)"),
           engine_arg: list[str] = typer.Option(None, "--engine-arg", help="engine argument (repeat; replaces all)"),
           reason: str = typer.Option("", "--reason", help="why (kept with the revision)"),
           as_json: bool = JSON_OPT) -> None:
    """Write the next revision of a deployment's template (running replicas are not touched)."""
    body = {"model": model, "profile": profile, "engine_args": engine_arg or None, "reason": reason}
    with session({"model": "--model", "profile": "--profile", "engine_args": "--engine-arg", "reason": "--reason"}) as c:
        rev = c.post(f"/api/ai/deployments/{name}/revisions", {k: v for k, v in body.items() if v is not None})
    emit_object(rev, as_json) if as_json else typer.echo(
        f"deployment {name}: revision {rev['revision']} written; roll it out with "
        f"`fabricctl ai deployment rollout {name} --to-revision {rev['revision']}`")


def _newest(c, name: str) -> dict:
    rollouts = c.get(f"/api/ai/deployments/{name}/rollouts")
    if not rollouts:
        typer.echo(f"error: deployment {name} has no rollout", err=True)
        raise typer.Exit(1)
    return rollouts[-1]


def _line(data: dict) -> str:
    rec = data.get("rollout") or {}
    share = "" if rec.get("share") is None else f" share {rec['share']}%"
    return f"rollout {rec.get('id')} ({rec.get('strategy')} {rec.get('from_revision')}->{rec.get('to_revision')}): " \
           f"{data.get('phase')}{share}: {data.get('message')}"


def _follow(c, name: str, as_json: bool, timeout: float | None = None) -> None:
    last = None
    deadline = time.monotonic() + timeout if timeout else None
    while True:
        data = c.get(f"/api/ai/explain/rollout/{name}")
        line = _line(data)
        if line != last and not as_json:
            typer.echo(line)
        last = line
        if data.get("phase") in ("Succeeded", "RolledBack"):
            if as_json:
                emit_json(data)
            raise typer.Exit(0 if data["phase"] == "Succeeded" else 1)
        if deadline is not None and time.monotonic() >= deadline:
            typer.echo(f"error: timed out after {timeout:g}s waiting for the rollout of {name}: {line}", err=True)
            raise typer.Exit(1)
        time.sleep(POLL_S)


def rollout(
    target: str = typer.Argument(..., metavar="NAME|ACTION", help="a deployment, or status|pause|resume|promote|"
                                                                  "rollback followed by the deployment"),
    name: str = typer.Argument(None, metavar="[NAME]", help="the deployment an action applies to"),
    to_revision: int = typer.Option(None, "--to-revision", help="default: the newest revision"),
    strategy: str = typer.Option("rolling", "--strategy", help="rolling, canary or blue-green"),
    canary_percent: int = typer.Option(None, "--canary-percent", help="canary: one step at this share, then 100"),
    steps: str = typer.Option(None, "--steps", help="canary steps PERCENT:SECS,...,100 (default 5:300,20:600,50:900,100)"),
    max_surge: int = typer.Option(1, "--max-surge", help="rolling: extra replicas at once"),
    max_unavailable: int = typer.Option(0, "--max-unavailable", help="rolling: replicas below the count at once"),
    min_healthy_secs: float = typer.Option(30.0, "--min-healthy-secs", help="rolling: Ready this long first"),
    error_rate_max: float = typer.Option(None, "--error-rate-max", help="roll back above this failed share (0-1)"),
    ttft_ms_max: float = typer.Option(None, "--ttft-ms-max", help="roll back above this mean TTFT"),
    rollback_window_secs: float = typer.Option(None, "--rollback-window-secs", help="blue/green: old set kept"),
    auto_promote: bool = typer.Option(False, "--auto-promote", help="blue/green: switch once the new set is ready"),
    follow: bool = typer.Option(False, "-w", "--watch", "--wait",
                                help="follow until Succeeded (exit 0) or RolledBack (1)"),
    timeout: float = typer.Option(None, "--timeout", min=1, help="with --wait: give up after this many seconds (exit 1)"),
    as_json: bool = JSON_OPT,
) -> None:
    """Start a rollout of NAME, or show/steer its current one (status|pause|resume|promote|rollback NAME)."""
    if name is not None:
        if target not in ACTIONS:
            raise typer.BadParameter(f"{target!r} is not one of {', '.join(ACTIONS)}", param_hint="ACTION")
        with session() as c:
            if target != "status":
                rec = _newest(c, name)
                c.post(f"/api/ai/deployments/{name}/rollouts/{rec['id']}/{target}", {})
            if follow:
                _follow(c, name, as_json, timeout)
            data = c.get(f"/api/ai/explain/rollout/{name}")
        emit_json(data) if as_json else typer.echo(_line(data) if data.get("rollout") else data.get("message"))
        return
    thresholds = {k: v for k, v in (("error_rate_max", error_rate_max), ("ttft_ms_max", ttft_ms_max)) if v is not None}
    body = {"to_revision": to_revision, "strategy": strategy, "max_surge": max_surge,
            "max_unavailable": max_unavailable, "min_healthy_secs": min_healthy_secs,
            "canary_percent": canary_percent, "steps": parse_steps(steps) if steps else None,
            "rollback_window_secs": rollback_window_secs, "auto_promote": auto_promote or None,
            "thresholds": thresholds or None}
    flags = {"to_revision": "--to-revision", "strategy": "--strategy", "max_surge": "--max-surge",
             "max_unavailable": "--max-unavailable", "canary_percent": "--canary-percent", "steps": "--steps",
             "thresholds.error_rate_max": "--error-rate-max", "thresholds.ttft_ms_max": "--ttft-ms-max"}
    with session(flags) as c:
        rec = c.post(f"/api/ai/deployments/{target}/rollouts", {k: v for k, v in body.items() if v is not None})
        if follow:
            if not as_json:
                typer.echo(f"rollout {rec['id']} of {target} started ({rec['strategy']} to revision {rec['to_revision']})")
            _follow(c, target, as_json, timeout)
    emit_object(rec, as_json) if as_json else typer.echo(
        f"rollout {rec['id']} of {target} started: {rec['strategy']} from revision {rec['from_revision']} "
        f"to {rec['to_revision']}")
