"""The console as a new operator uses it, in Debian's chromium: real fabricd (controllers on),
a real fabric-agent (dry-run driver: each replica a real fabric-engine-sim on loopback) and a
real fabric-gateway. Sign in, add the lab's model through the form, add a profile, deploy it,
expose it, get a streamed answer in the playground (TTFT, tokens/s, usage, and the replica that
answered: its id from the answer's x-fabric-replica), see the weight chart, and the playground's
key is gone afterwards. The viewer is refused the playground (page and API) until the
endpoint's key policy sets viewer_playground, then gets its own streamed answer. Screenshots
of each new page.
"""

from __future__ import annotations

import pytest
from playwright.sync_api import expect, sync_playwright

from lab.rigs.polling import wait_for
from lab.rigs.servers import free_port
from tests.controlplane.console.test_console_browser import CHROMIUM, SCREENSHOTS
from tests.gateway.gateway_harness import HMAC_SECRET, GatewayProcess
from tests.integration.orchestration_harness import start_cluster

pytestmark = pytest.mark.e2e


def test_new_operator_adds_deploys_exposes_and_tries_a_model(tmp_path):
    gport = free_port()
    env = {"FABRIC_ADDRESS_POOL": "127.0.99.8", "FABRIC_KEY_HMAC_SECRET": HMAC_SECRET,
           "FABRIC_CONSOLE_GATEWAY_URL": f"http://127.0.0.1:{gport}"}
    with start_cluster(tmp_path, gpus=2, env=env) as cluster, cluster.api() as api:
        gw = GatewayProcess.start(tmp_path, f"sqlite://{cluster.state_dir}/fabric.db", port=gport)
        password = (cluster.state_dir / "admin-password").read_text().strip()
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)

        def shot(page, name):
            page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                errors: list[str] = []
                page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
                page.goto(f"{cluster.url}/app/ai/login")
                page.get_by_label("Password").fill(password)
                page.get_by_label("Password").press("Enter")
                expect(page.get_by_test_id("whoami")).to_contain_text("admin")
                base = f"{cluster.url}/app/ai"
                page.goto(f"{base}/models/new")
                page.get_by_label("Name", exact=True).fill("lab")
                page.get_by_label("Source").fill("hf://Qwen/Qwen3-8B")
                page.get_by_label("License").fill("apache-2.0")
                page.get_by_role("button", name="Dry run").click()
                expect(page.get_by_test_id("supply-chain-checks")).to_contain_text("SHA-256")
                shot(page, "model-new-dry-run")
                page.get_by_role("button", name="Add a model").click()
                expect(page.locator("main")).to_contain_text("hf://Qwen/Qwen3-8B")
                page.goto(f"{base}/profiles/new")
                page.get_by_label("Name", exact=True).fill("g1")
                page.get_by_label("vCPUs").fill("1")
                page.get_by_label("Memory (GiB)").fill("1")
                page.get_by_label("VRAM per GPU (GiB)").fill("24")  # the API requires it (no default)
                page.get_by_role("button", name="Add a profile").click()
                page.goto(f"{base}/deployments/new")
                page.get_by_label("Name", exact=True).fill("lab")
                page.get_by_label("Model").select_option("lab")
                page.get_by_label("Profile").select_option("g1")
                page.get_by_label("Replicas", exact=True).fill("2")
                shot(page, "deployment-new")
                page.get_by_role("button", name="Deploy a model").click()
                expect(page.get_by_test_id("message")).to_contain_text("deployment lab created")
                wait_for(lambda: api.get("/api/ai/deployments/lab").json()["status"].get("ready_replicas") == 2,
                         120, "2 ready replicas")
                page.goto(f"{base}/endpoints/new")
                page.get_by_label("Name", exact=True).fill("lab-openai")
                page.get_by_label("Deployment").select_option("lab")
                # The gateway picks the replica: this cluster has no dataplane, so its VIP carries nothing.
                page.get_by_label("Gateway routing").select_option("round_robin")
                page.get_by_role("button", name="Expose an endpoint").click()
                expect(page.get_by_test_id("message")).to_contain_text("endpoint lab-openai created")
                wait_for(lambda: all(r["weight"] for r in
                                     api.get("/api/ai/explain/routing/lab-openai").json()["replicas"] or [{}]),
                         60, "weights on both replicas")
                page.goto(f"{base}/endpoints/lab-openai/try")
                # The gateway's copy of the store may be up to its refresh TTL behind the published
                # plan: until it has the new replicas it sends through the VIP (Maglev picks, no
                # replica is named) or answers an error; then an answer names its replica.
                for _ in range(15):
                    page.get_by_role("button", name="Send").click()
                    expect(page.locator("#try-form[data-done], #try-error:not([hidden])")).to_have_count(
                        1, timeout=30_000)
                    if page.locator("#try-form[data-done]").count() and \
                            page.locator("#stat-replica").get_attribute("data-source") == "x-fabric-replica":
                        break
                    page.wait_for_timeout(2000)
                expect(page.locator("#try-form[data-done]")).to_have_count(1)
                assert page.get_by_test_id("answer").inner_text().strip()
                expect(page.locator("#stat-ttft")).to_contain_text("ms")
                expect(page.locator("#stat-usage")).to_contain_text("completion tokens")
                expect(page.get_by_test_id("try-error")).to_be_hidden()
                replicas = {r["replica_id"] for r in api.get("/api/ai/explain/routing/lab-openai").json()["replicas"]}
                assert page.locator("#stat-replica").inner_text().strip() in replicas
                expect(page.locator("#stat-replica")).to_have_attribute("data-source", "x-fabric-replica")
                shot(page, "playground")
                keys = api.get("/api/ai/keys").json()
                assert not [k for k in keys if k["name"].startswith("console-try-")]  # revoked after the answer
                viewer_try(browser, cluster, api, base, shot)
                page.goto(f"{base}/endpoints/lab-openai")
                expect(page.locator("[data-testid=chart-lab-openai-weight] g[data-series]")).to_have_count(
                    2, timeout=30_000)
                shot(page, "endpoint-charts")
                page.goto(f"{base}/deployments/lab")
                expect(page.get_by_test_id("placement")).to_be_visible()
                shot(page, "deployment-detail")
                page.goto(f"{base}/models")
                expect(page.get_by_test_id("model-jobs")).to_contain_text("lab")
                shot(page, "models-jobs")
                assert not errors, errors
                browser.close()
        except AssertionError:
            raise AssertionError(cluster.tail() + gw.log_text()[-3000:]) from None
        finally:
            gw.proc.terminate()
            gw.proc.wait(10)


def viewer_try(browser, cluster, api, base: str, shot) -> None:
    """The viewer: refused (Send disabled, and the chat route answers the API's 403) until the
    endpoint's key policy lets viewers in; then a streamed answer, and its key is gone after."""
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    page = ctx.new_page()
    page.goto(f"{base}/login")
    page.get_by_label("Username").fill("viewer")
    page.get_by_label("Password").fill((cluster.state_dir / "viewer-password").read_text().strip())
    page.get_by_label("Password").press("Enter")
    expect(page.get_by_test_id("whoami")).to_contain_text("viewer")
    page.goto(f"{base}/endpoints/lab-openai/try")
    expect(page.get_by_role("button", name="Send")).to_be_disabled()
    expect(page.get_by_test_id("try-policy")).to_contain_text("--viewer-playground")
    answer = page.evaluate("""async () => {
        const form = document.getElementById("try-form");
        const r = await fetch(form.dataset.url, {method: "POST", body: JSON.stringify({prompt: "hi"}),
            headers: {"content-type": "application/json", "x-csrf-token": form.dataset.csrf}});
        return await r.text();
    }""")
    assert "event: error" in answer and "playground_refused" in answer and "event: token" not in answer
    assert api.put("/api/ai/key-policies/lab-openai", json={"viewer_playground": True}).status_code == 200
    page.reload()
    expect(page.get_by_test_id("try-policy")).to_contain_text("Viewers may use this playground")
    page.get_by_role("button", name="Send").click()
    expect(page.locator("#try-form[data-done], #try-error:not([hidden])")).to_have_count(1, timeout=30_000)
    expect(page.get_by_test_id("try-error")).to_be_hidden()
    assert page.get_by_test_id("answer").inner_text().strip()
    shot(page, "playground-viewer")
    assert not [k for k in api.get("/api/ai/keys").json() if k["name"].startswith("console-try-")]
    ctx.close()
