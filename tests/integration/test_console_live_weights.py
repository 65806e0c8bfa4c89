"""The console's weight charts on real engines: real fabricd (controllers on) and fabric-agent
(dry-run driver, so each replica is a real fabric-engine-sim on loopback), Playwright driving
Debian's chromium. `scripts/lab-load --replica ID --queue 20` (pointed at this cluster through a
lab.json of its own) raises one engine's queue: that replica's bar in the open Endpoints page
shrinks, redrawn by htmx with no reload, and its line in the endpoint's weight-over-time chart
steps down from the weight it had. The chart survives a restart of fabricd (its bounded history
is saved in the state directory): both weights are still on the line afterwards.
"""

from __future__ import annotations

import json
import signal
import subprocess

import pytest
from playwright.sync_api import expect, sync_playwright

from lab.rigs.polling import wait_for
from tests.controlplane.console.test_console_browser import CHROMIUM, REPO, SCREENSHOTS
from tests.integration.orchestration_harness import deploy, start_cluster

# full (scripts/test-full; 27 s); make test covers it with the weights' rule on the lab's live map (tests/e2e/test_lab_story.py's load chapter) and the console's pages in a browser (tests/controlplane/console/)
pytestmark = [pytest.mark.e2e, pytest.mark.full]
DEP, EP = "live", "live-openai"


def heights(line) -> set[float]:
    """The y of every point on a chart series' polyline."""
    return {float(xy.split(",")[1]) for xy in line.locator("polyline").get_attribute("points").split()}


def test_weight_charts_follow_lab_load_on_one_replica(tmp_path):
    with start_cluster(tmp_path, gpus=2, env={"FABRIC_ADDRESS_POOL": "10.96.0.9"}) as cluster, \
            cluster.api() as api:
        deploy(api, DEP, EP, 2, routing="least_queue")

        def routed():
            rows = api.get(f"/api/ai/explain/routing/{EP}").json()["replicas"]
            return len(rows) == 2 and all(r["included"] and r["weight"] for r in rows) and rows
        try:
            rows = wait_for(routed, 90, "2 routed replicas")
        except AssertionError:
            raise AssertionError(cluster.tail()) from None
        loaded = rows[0]
        password = (cluster.state_dir / "admin-password").read_text().strip()
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                page.goto(f"{cluster.url}/app/ai/login")
                page.get_by_label("Password").fill(password)
                page.get_by_role("button", name="Sign in").click()
                expect(page.get_by_test_id("whoami")).to_contain_text("admin")
                rid = loaded["replica_id"]
                # The weight-over-time line of that replica, once it has a point older than the
                # history's 5 s spacing (a point that later samples no longer overwrite).
                page.goto(f"{cluster.url}/app/ai/endpoints/{EP}")
                line = page.locator(f'[data-testid="chart-{EP}-weight"] g[data-series="{rid}"]')
                expect(line.locator("polyline")).to_have_count(1, timeout=30_000)
                before = int(loaded["weight"])
                assert float(line.get_attribute("data-last")) == before
                page.goto(f"{cluster.url}/app/ai/endpoints")
                bar = page.locator(f'[data-testid=weights-{EP}] g[data-replica="{rid}"]')
                expect(bar).to_have_attribute("data-weight", str(before))
                lab = tmp_path / "lab-state"
                lab.mkdir()
                (lab / "lab.json").write_text(json.dumps({"FABRIC_URL": cluster.url, "FABRIC_TOKEN": cluster.token,
                                                          "FABRIC_CA": str(cluster.state_dir / "pki" / "ca.crt")}))
                out = subprocess.run([str(REPO / "scripts" / "lab-load"), "--state-dir", str(lab), "--deployment", DEP,
                                      "--endpoint", EP, "--replica", rid, "--queue", "20"],
                                     capture_output=True, text=True, timeout=60)
                assert out.returncode == 0, out.stdout + out.stderr
                assert f"replica {rid}" in out.stdout and "synthetic queue set to 20" in out.stdout

                def shrunk():
                    return int(bar.get_attribute("data-weight") or before) < before
                wait_for(shrunk, 30, "the loaded replica's bar to shrink")
                weight_cell = page.get_by_test_id(f"weight-{rid}")
                expect(weight_cell).not_to_have_text(str(before))
                expect(page.locator(f"[data-testid=weights-{EP}]")).to_contain_text("queue 20")
                page.screenshot(path=str(SCREENSHOTS / "endpoints-live-load.png"), full_page=True)
                # The chart over time: the same replica's line steps down (redrawn every 5 s).
                page.goto(f"{cluster.url}/app/ai/endpoints/{EP}")
                wait_for(lambda: float(line.get_attribute("data-last") or before) < before, 30,
                         "the weight chart's line of the loaded replica to step down")
                ys = heights(line)
                assert len(ys) > 1  # the old weight and the new one, both on the line
                page.screenshot(path=str(SCREENSHOTS / "endpoint-charts-live-load.png"), full_page=True)
                # The model was really materialized by the agent (from the loopback HF mirror).
                page.get_by_role("link", name="Models", exact=True).click()
                expect(page.locator("main")).to_contain_text("node-a: Ready")
                expect(page.locator("main")).to_contain_text("100%")
                page.screenshot(path=str(SCREENSHOTS / "models-live.png"), full_page=True)
                page.get_by_role("link", name="Nodes & GPUs", exact=True).click()
                expect(page.get_by_role("cell", name=f"{DEP}-", exact=False).first).to_be_visible()  # held GPUs
                page.screenshot(path=str(SCREENSHOTS / "nodes-live.png"), full_page=True)
                # A clean restart of fabricd keeps the charts (controlplane.history_file).
                cluster.kill_fabricd(signal.SIGTERM)
                cluster.start_fabricd()
                page.goto(f"{cluster.url}/app/ai/endpoints/{EP}")
                expect(line.locator("polyline")).to_have_count(1)
                assert ys <= heights(line), "the weight line lost its points in the restart"
            finally:
                browser.close()
