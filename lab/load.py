"""`scripts/lab-load`: put load on the lab and watch the Maglev weights move.

  scripts/lab-load --replica demo-llm-0-83466d --queue 40
                                              synthetic queue on that replica (its engine's /sim/load),
                                              so least_queue routing lowers its weight; --replica
                                              also takes an ordinal (0)
  scripts/lab-load --replica 0 --queue 0      take it off again
  scripts/lab-load --requests 200 --concurrency 16
                                              real chat completions through the VIP from the client
                                              namespace; prints which replica answered each

Reads FABRIC_URL/FABRIC_TOKEN/FABRIC_CA from the lab's state ($FABRIC_LAB_STATE, else
/var/lib/fabric/lab: the same from any directory). A lab that is down, a deployment, endpoint or
replica that does not exist is one error line naming what does. The watch prints each replica's
weight by name.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx

from common.cli_guard import run_guarded
from lab.cluster import lab_state_dir


def fail(message: str) -> None:
    sys.exit(f"lab-load: error: {message}")


def names(items: list[dict], field: str = "name") -> str:
    return ", ".join(sorted(str(i[field]) for i in items)) or "(none)"


def get_or_none(api: httpx.Client, path: str) -> dict | None:
    r = api.get(path)
    if r.status_code == 404:
        return None
    r.raise_for_status()
    return r.json()


def pick_replica(reps: list[dict], wanted: str, deployment: str) -> dict:
    """A replica by its name (stable across rollouts: demo-llm-0-83466d) or its ordinal."""
    rep = next((r for r in reps if r["replica_id"] == wanted or (wanted.isdigit() and r["ordinal"] == int(wanted))),
               None)
    if rep is None:
        have = ", ".join(f"{r['replica_id']} (ordinal {r['ordinal']})" for r in sorted(reps, key=lambda r: r["ordinal"]))
        fail(f"deployment {deployment} has no replica {wanted!r}; it has: {have or '(none)'}")
    if not rep.get("host"):
        fail(f"replica {rep['replica_id']} has no address yet ({rep.get('phase', '')}); try again when it is Ready")
    return rep


def weights_line(plan: dict) -> str:
    """The weights by replica name (what `fabricctl ai replica list` shows), not backend address."""
    reps = plan.get("replicas") or []
    if reps:
        return "  ".join(f"{r['replica_id']}={r.get('weight') or 0}" for r in reps)
    return "  ".join(f"{b['backend']}={b['weight']}" for b in plan.get("backends", [])) or "(no replicas routed)"


def main() -> None:
    ap = argparse.ArgumentParser(prog="scripts/lab-load", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--state-dir", default=None, help="the lab's state (default $FABRIC_LAB_STATE or /var/lib/fabric/lab)")
    ap.add_argument("--deployment", default="demo-llm")
    ap.add_argument("--endpoint", default=None, help="default: the endpoint exposing the deployment")
    ap.add_argument("--replica", default=None,
                    help="for --queue: a replica's name (fabricctl ai replica list) or its ordinal")
    ap.add_argument("--queue", type=int, default=None, help="synthetic waiting requests on that replica")
    ap.add_argument("--requests", type=int, default=0, help="real requests through the VIP")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--watch", type=float, default=0, help="then show the weights every 2 s for this many seconds")
    args = ap.parse_args()

    state = Path(args.state_dir).resolve() if args.state_dir else lab_state_dir()
    try:
        lab = json.loads((state / "lab.json").read_text())
    except FileNotFoundError:
        fail(f"the lab is not up ({state / 'lab.json'} is missing); run `fabric-lab up` first")
    ctx = ssl.create_default_context(cafile=lab["FABRIC_CA"])
    api = httpx.Client(base_url=lab["FABRIC_URL"], verify=ctx, timeout=10,
                       headers={"Authorization": f"Bearer {lab['FABRIC_TOKEN']}"})
    if get_or_none(api, f"/api/ai/deployments/{args.deployment}") is None:
        fail(f"deployment {args.deployment!r} not found; deployments: {names(api.get('/api/ai/deployments').json())}")
    endpoints = api.get("/api/ai/endpoints").json()
    endpoint = args.endpoint or next((e["name"] for e in endpoints if e.get("deployment") == args.deployment),
                                     f"{args.deployment}-openai")
    exposed = any(e["name"] == endpoint for e in endpoints)
    if not exposed and (args.requests or args.watch or args.queue is None):
        fail(f"endpoint {endpoint!r} not found; endpoints: {names(endpoints)} "
             f"(expose the deployment with `fabricctl ai endpoint expose {args.deployment}`)")

    def weights() -> str:
        return weights_line(api.get(f"/api/ai/explain/routing/{endpoint}").json())

    if args.queue is not None:
        if args.replica is None:
            fail("--queue needs --replica NAME (or its ordinal)")
        reps = api.get(f"/api/ai/deployments/{args.deployment}/metrics").json()["replicas"]
        rep = pick_replica(reps, str(args.replica), args.deployment)
        url = f"http://{rep['host']}:{rep.get('port', 8000)}/sim/load"
        r = httpx.post(url, json={"queue": args.queue}, timeout=5)
        r.raise_for_status()
        print(f"replica {rep['replica_id']} ({rep['host']}): synthetic queue set to {args.queue}")

    if args.requests:
        ep = api.get(f"/api/ai/endpoints/{endpoint}").json()
        vip, port = ep["status"]["vip"], ep.get("port", 8000)
        body = json.dumps({"model": args.deployment, "max_tokens": 8,
                           "messages": [{"role": "user", "content": "load"}]})

        def one(_: int) -> str:
            out = subprocess.run(["ip", "netns", "exec", "fabric-lab-client", "curl", "-s", "-D", "-", "-o", "/dev/null",
                                  "--max-time", "20", f"http://{vip}:{port}/v1/chat/completions",
                                  "-H", "content-type: application/json", "-d", body],
                                 capture_output=True, text=True).stdout
            return next((line.split(":", 1)[1].strip() for line in out.splitlines()
                         if line.lower().startswith("x-fabric-replica")), "error")

        with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
            counts = collections.Counter(pool.map(one, range(args.requests)))
        for replica, n in sorted(counts.items()):
            print(f"{replica}: {n} requests ({100 * n / args.requests:.0f}%)")

    deadline = time.monotonic() + args.watch
    while exposed:
        print(time.strftime("%H:%M:%S"), weights())
        if time.monotonic() >= deadline:
            break
        time.sleep(2)


if __name__ == "__main__":
    run_guarded(main, "lab-load")
