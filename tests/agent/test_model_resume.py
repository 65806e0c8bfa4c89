"""A real `fabric-agent serve` killed (SIGKILL) in the middle of a download: the restarted agent
resumes the job from its record and the partial file with a Range request, and the agent API
serves jobs, the cache, verification and eviction."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from agent.models.checks import build_manifest
from lab.rigs.polling import clean_env, wait_for
from lab.rigs.servers import free_port
from tests.agent.model_support import REPO, mirror

BIG = "model-00001-of-00002.safetensors"


def start_agent(state: Path, port: int, endpoint: str, log: Path) -> subprocess.Popen:
    cmd = [str(Path(sys.executable).parent / "fabric-agent"), "serve", "--node-id", "node-a", "--insecure",
           "--listen", f"127.0.0.1:{port}", "--vm-driver", "dry-run", "--no-dataplane",
           "--state-dir", str(state), "--log-level", "warning"]
    env = clean_env({"HF_ENDPOINT": endpoint, "FABRIC_MODEL_DIR": str(state / "srv")})
    env.pop("HF_TOKEN", None)
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def up():
        try:
            return httpx.get(f"http://127.0.0.1:{port}/v1/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return proc.poll() is not None and RuntimeError(log.read_text()[-2000:])

    assert wait_for(up, 30, "the agent to answer") is True, log.read_text()[-2000:]
    return proc


def test_agent_killed_mid_download_resumes_the_partial_file(tmp_path):
    state, port = tmp_path / "agent", free_port()
    log = tmp_path / "agent.log"
    # The agent is killed once 10 MiB of the big file are on disk (the library writes each piece as
    # received), so the file must be well over 10 MiB for the kill to land mid-download.
    with mirror(tmp_path, rate=6_000_000, extra_bytes=24_000_000) as m:
        url = f"http://127.0.0.1:{port}"
        agent = start_agent(state, port, m.url, log)
        try:
            r = httpx.post(f"{url}/v1/models/jobs", json={"job_id": "tiny.node-a", "model": "tiny",
                                                         "source": f"hf://{REPO}"}, timeout=5)
            assert r.status_code == 202, r.text
            partial = state / "models" / "staging"
            wait_for(lambda: any(p.stat().st_size >= 10 << 20 for p in partial.rglob(f"*{BIG}")), 30,
                     "part of the big file to arrive")
            view = httpx.get(f"{url}/v1/models/jobs/tiny.node-a", timeout=5).json()
            assert view["state"] == "Downloading" and 0 < view["bytes_done"] < view["bytes_total"]
        finally:
            os.killpg(agent.pid, signal.SIGKILL)
            agent.wait(10)
        had = max(p.stat().st_size for p in partial.rglob(f"*{BIG}"))
        agent = start_agent(state, port, m.url, log)
        try:
            done = wait_for(lambda: (v := httpx.get(f"{url}/v1/models/jobs/tiny.node-a", timeout=5).json())
                            and v["state"] in ("Ready", "Failed") and v, 60, "the resumed job")
            assert done["state"] == "Ready", done["message"]
            ranges = [rng for method, path, rng in m.cfg.requests if method == "GET" and path.endswith(BIG)]
            assert len(ranges) == 2 and ranges[0] == ""
            resumed_at = int(ranges[1].removeprefix("bytes=").split("-")[0])
            assert 0 < resumed_at and resumed_at >= had - 1  # continued, not restarted
            assert [t["state"] for t in done["history"]].count("Downloading") == 2  # one per run
            assert done["digest"] == build_manifest(tmp_path / "mirror" / REPO).digest

            cache = httpx.get(f"{url}/v1/models/cache", timeout=5).json()
            assert [e["digest"] for e in cache["entries"]] == [done["digest"]]
            ok = httpx.post(f"{url}/v1/models/verify", json={"digest": done["digest"]}, timeout=30).json()
            assert ok["ok"] is True
            # Bytes changed on disk after Ready: verify says so.
            with open(Path(done["path"]) / "config.json", "ab") as f:
                f.write(b" ")
            bad = httpx.post(f"{url}/v1/models/verify", json={"digest": done["digest"]}, timeout=30).json()
            assert bad["ok"] is False and "hash to" in bad["message"]
            assert httpx.delete(f"{url}/v1/models/cache/{done['digest']}", timeout=10).status_code == 204
            assert httpx.get(f"{url}/v1/models/cache", timeout=5).json()["entries"] == []
            assert httpx.delete(f"{url}/v1/models/cache/{done['digest']}", timeout=10).status_code == 404
            assert httpx.get(f"{url}/v1/models/jobs/tiny.node-a", timeout=5).status_code == 404
            bad_digest = httpx.delete(f"{url}/v1/models/cache/..%2F..%2Fetc", timeout=5)
            assert bad_digest.status_code in (404, 422)
        finally:
            os.killpg(agent.pid, signal.SIGKILL)
            agent.wait(10)
