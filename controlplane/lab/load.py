"""`scripts/lab-load`: put load on the lab and watch the Maglev weights move.

  scripts/lab-load --replica 0 --queue 40     synthetic queue on replica ordinal 0 (its engine's
                                              /sim/load), so least_queue routing lowers its weight
  scripts/lab-load --replica 0 --queue 0      take it off again
  scripts/lab-load --requests 200 --concurrency 16
                                              real chat completions through the VIP from the client
                                              namespace; prints which replica answered each

Reads FABRIC_URL/FABRIC_TOKEN/FABRIC_CA from the lab's state ($FABRIC_LAB_STATE, else
/var/lib/fabric/lab: the same from any directory). A lab that is down is one error line.
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
from controlplane.lab.cluster import lab_state_dir


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--state-dir", default=None, help="the lab's state (default $FABRIC_LAB_STATE or /var/lib/fabric/lab)")
    ap.add_argument("--deployment", default="demo-llm")
    ap.add_argument("--endpoint", default=None)
    ap.add_argument("--replica", type=int, default=None, help="replica ordinal for --queue")
    ap.add_argument("--queue", type=int, default=None, help="synthetic waiting requests on that replica")
    ap.add_argument("--requests", type=int, default=0, help="real requests through the VIP")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--watch", type=float, default=0, help="then show the weights every 2 s for this many seconds")
    args = ap.parse_args()

    state = Path(args.state_dir).resolve() if args.state_dir else lab_state_dir()
    try:
        lab = json.loads((state / "lab.json").read_text())
    except FileNotFoundError:
        sys.exit(f"error: the lab is not up ({state / 'lab.json'} is missing); run `fabricd lab up` first")
    ctx = ssl.create_default_context(cafile=lab["FABRIC_CA"])
    api = httpx.Client(base_url=lab["FABRIC_URL"], verify=ctx, timeout=10,
                       headers={"Authorization": f"Bearer {lab['FABRIC_TOKEN']}"})
    endpoint = args.endpoint or f"{args.deployment}-openai"


    def weights() -> str:
        plan = api.get(f"/api/ai/explain/routing/{endpoint}").json()
        return "  ".join(f"{b['backend']}={b['weight']}" for b in plan.get("backends", []))


    if args.queue is not None:
        if args.replica is None:
            sys.exit("--queue needs --replica ORDINAL")
        reps = api.get(f"/api/ai/deployments/{args.deployment}/metrics").json()["replicas"]
        rep = next((r for r in reps if r["ordinal"] == args.replica), None)
        if rep is None or not rep.get("host"):
            sys.exit(f"no replica with ordinal {args.replica} and an address in {args.deployment}")
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
    while True:
        print(time.strftime("%H:%M:%S"), weights())
        if time.monotonic() >= deadline:
            break
        time.sleep(2)


if __name__ == "__main__":
    run_guarded(main, "lab-load")
