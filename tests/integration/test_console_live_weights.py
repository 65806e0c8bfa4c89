"""The console's weights chart on real engines: real fabricd (controllers on) and fabric-agent
(dry-run driver, so each replica is a real fabric-engine-sim on loopback), Playwright driving
Debian's chromium. Raising one engine's queue with POST /sim/load must shrink that replica's
bar in the open Endpoints page, redrawn by htmx with no reload.
"""

from __future__ import annotations

import httpx
import pytest
from playwright.sync_api import expect, sync_playwright

from tests.controlplane.console.test_console_browser import CHROMIUM, SCREENSHOTS
from tests.integration.orchestration_harness import deploy, start_cluster
from tests.support.polling import wait_for

pytestmark = pytest.mark.e2e
DEP, EP = "live", "live-openai"


def test_weights_chart_follows_an_engines_queue(tmp_path):
    with start_cluster(tmp_path, gpus=2, env={"FABRIC_ADDRESS_POOL": "10.96.0.9"}) as cluster, \
            cluster.api() as api, httpx.Client(timeout=5) as plain:
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
                page.goto(f"{cluster.url}/app/ai/endpoints")
                bar = page.locator(f'[data-testid=weights-{EP}] g[data-replica="{loaded["replica_id"]}"]')
                expect(bar).to_have_attribute("data-weight", str(loaded["weight"]))
                before = int(loaded["weight"])
                base = f"http://{loaded['host']}:{loaded['port']}"
                assert plain.post(f"{base}/sim/load", json={"waiting": 20}).status_code == 200

                def shrunk():
                    return int(bar.get_attribute("data-weight") or before) < before
                wait_for(shrunk, 30, "the loaded replica's bar to shrink")
                weight_cell = page.get_by_test_id(f"weight-{loaded['replica_id']}")
                expect(weight_cell).not_to_have_text(str(before))
                expect(page.locator(f"[data-testid=weights-{EP}]")).to_contain_text("queue 20")
                page.screenshot(path=str(SCREENSHOTS / "endpoints-live-load.png"), full_page=True)
                # The model was really materialized by the agent (from the loopback HF mirror).
                page.get_by_role("link", name="Models", exact=True).click()
                expect(page.locator("main")).to_contain_text("node-a: Ready")
                expect(page.locator("main")).to_contain_text("100%")
                page.screenshot(path=str(SCREENSHOTS / "models-live.png"), full_page=True)
                page.get_by_role("link", name="Nodes & GPUs", exact=True).click()
                expect(page.get_by_role("cell", name=f"{DEP}-", exact=False).first).to_be_visible()  # held GPUs
                page.screenshot(path=str(SCREENSHOTS / "nodes-live.png"), full_page=True)
            finally:
                browser.close()
