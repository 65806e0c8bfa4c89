"""The console in a real browser: Playwright driving Debian's chromium (/usr/bin/chromium, from
scripts/setup.sh; Playwright's own browser download is not used) against the real fabricd of
conftest.py. Each page is photographed into SCREENSHOTS (.state/screenshots/console by default,
FABRIC_CONSOLE_SCREENSHOTS to choose; docs/console.md links a committed set).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from playwright.sync_api import expect, sync_playwright

from lab.rigs.polling import wait_for
from tests.controlplane.console.conftest import CONSOLE, WAIT_S

CHROMIUM = "/usr/bin/chromium"
REPO = Path(__file__).resolve().parents[3]
SCREENSHOTS = Path(os.environ.get("FABRIC_CONSOLE_SCREENSHOTS", REPO / ".state" / "screenshots" / "console"))
NAV = [("Models", "models"), ("Profiles", "profiles"), ("Deployments", "deployments"), ("Endpoints", "endpoints"),
       ("API keys", "keys"), ("Nodes & GPUs", "nodes"), ("Events", "events")]


@pytest.fixture(scope="module")
def browser():
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()


# WCAG contrast of every element that holds text, against the nearest opaque background above it.
CONTRAST_JS = """() => {
  const rgb = s => s.match(/[\\d.]+/g).map(Number);
  const lum = ([r, g, b]) => { const f = c => { c /= 255; return c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4; };
                               return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b); };
  const bg = el => { for (; el; el = el.parentElement) { const c = rgb(getComputedStyle(el).backgroundColor);
                     if (c.length < 4 || c[3] > 0.99) return c.slice(0, 3); } return [255, 255, 255]; };
  const worst = [];
  for (const el of document.querySelectorAll('body *')) {
    if (!el.offsetParent && el.tagName !== 'BODY') continue;
    if (![...el.childNodes].some(n => n.nodeType === 3 && n.textContent.trim())) continue;
    const a = lum(rgb(getComputedStyle(el).color)), b = lum(bg(el));
    const ratio = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
    if (ratio < 4.5) worst.push(el.tagName + ' ' + el.textContent.trim().slice(0, 30) + ' ' + ratio.toFixed(2));
  }
  return worst;
}"""


def new_page(browser, width: int = 1280, height: int = 900):
    # fabricd's certificate comes from the cluster's own CA, which this browser profile does not know.
    ctx = browser.new_context(ignore_https_errors=True, viewport={"width": width, "height": height})
    return ctx, ctx.new_page()


def sign_in(page, cluster, username: str = "admin", password: str | None = None) -> None:
    page.goto(f"{cluster.url}{CONSOLE}")
    expect(page).to_have_url(f"{cluster.url}{CONSOLE}/login")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password or cluster.server.password)
    page.get_by_label("Password").press("Enter")  # keyboard submit
    expect(page.get_by_test_id("whoami")).to_contain_text(username)


def shot(page, name: str) -> None:
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


def test_sign_in_and_every_page_with_real_data(browser, cluster):
    ctx, page = new_page(browser)
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.goto(f"{cluster.url}{CONSOLE}/login")
    shot(page, "login")
    sign_in(page, cluster)
    expect(page.get_by_test_id("capacity-gpus")).to_contain_text("free of 2")
    shot(page, "overview")
    for label, name in NAV:
        page.get_by_role("link", name=label, exact=True).click()
        expect(page.get_by_role("link", name=label, exact=True)).to_have_attribute("aria-current", "page")
        if name == "endpoints":  # the weights chart arrives through htmx
            expect(page.locator("[data-testid=weights-chat-openai] svg g[data-replica]")).to_have_count(3)
        shot(page, name)
        assert page.evaluate(CONTRAST_JS) == [], f"text below 4.5:1 contrast on {name}"
    expect(page.get_by_role("cell", name="gpu-node-1").first).to_be_visible()
    assert not errors, errors  # no script or CSP errors
    ctx.close()


def test_weights_chart_follows_the_cluster_without_a_reload(browser, cluster):
    ctx, page = new_page(browser)
    sign_in(page, cluster)
    page.goto(f"{cluster.url}{CONSOLE}/endpoints")
    bars = page.locator("[data-testid=weights-chat-openai] svg g[data-replica]")
    expect(bars).to_have_count(3)
    with cluster.api() as api:
        assert api.post("/api/ai/deployments/chat/scale", json={"replicas": 2}).status_code == 200
        try:
            expect(bars).to_have_count(2, timeout=30_000)  # the htmx poll redraws it
        finally:
            api.post("/api/ai/deployments/chat/scale", json={"replicas": 3})
            wait_for(lambda: api.get("/api/ai/deployments/chat").json()["status"]["ready_replicas"] == 3,
                     WAIT_S, "3 ready", interval=0.2)
    ctx.close()


def test_scale_from_the_console_and_watch_the_count(browser, cluster):
    ctx, page = new_page(browser)
    sign_in(page, cluster)
    page.goto(f"{cluster.url}{CONSOLE}/deployments")
    page.get_by_label("Replicas").first.fill("1")
    page.get_by_role("button", name="Scale chat", exact=True).click()
    expect(page.get_by_test_id("message")).to_contain_text("scaled to 1")
    replicas = page.get_by_test_id("replicas-chat")
    for _ in range(60):
        page.reload()
        if "1 ready of 1 desired" in replicas.inner_text():
            break
        page.wait_for_timeout(500)
    expect(replicas).to_contain_text("1 ready of 1 desired")
    shot(page, "deployments-scaled")
    page.get_by_label("Replicas").first.fill("3")
    page.get_by_role("button", name="Scale chat", exact=True).click()
    expect(page.get_by_test_id("message")).to_contain_text("scaled to 3")
    with cluster.api() as api:
        wait_for(lambda: api.get("/api/ai/deployments/chat").json()["status"]["ready_replicas"] == 3,
                 WAIT_S, "3 ready", interval=0.2)
    ctx.close()


def test_create_a_key_and_see_the_secret_once(browser, cluster):
    ctx, page = new_page(browser)
    sign_in(page, cluster)
    page.goto(f"{cluster.url}{CONSOLE}/keys")
    page.get_by_label("Name").fill("browser-key")
    page.get_by_role("button", name="Create key").click()
    secret = page.get_by_test_id("secret-value").input_value()
    assert len(secret) > 20
    shot(page, "keys-secret-once")
    page.goto(f"{cluster.url}{CONSOLE}/keys")
    expect(page.get_by_test_id("key-browser-key")).to_be_visible()
    expect(page.get_by_test_id("secret")).to_have_count(0)
    assert secret not in page.content()
    # A write without the CSRF token, from the signed-in page itself, is refused.
    status = page.evaluate("""async () => (await fetch('/app/ai/keys', {method: 'POST',
        headers: {'content-type': 'application/x-www-form-urlencoded'},
        body: 'name=no-csrf&endpoint=chat-openai'})).status""")
    assert status == 403
    ctx.close()


def test_viewer_has_no_write_buttons(browser, cluster):
    ctx, page = new_page(browser)
    sign_in(page, cluster, "viewer", cluster.viewer_password)
    expect(page.get_by_test_id("whoami")).to_contain_text("read-only")
    # Keyboard: the first Tab reaches the skip link, Enter moves focus to the content.
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Skip to content"
    page.keyboard.press("Enter")
    assert page.evaluate("document.activeElement.id") == "main"
    page.goto(f"{cluster.url}{CONSOLE}/deployments")
    expect(page.get_by_role("button", name="Scale chat", exact=True)).to_have_count(0)
    page.goto(f"{cluster.url}{CONSOLE}/keys")
    expect(page.get_by_role("button", name="Create key")).to_have_count(0)
    shot(page, "keys-viewer")
    ctx.close()


def test_phone_width_has_no_sideways_page_scroll(browser, cluster):
    ctx, page = new_page(browser, 390, 844)
    sign_in(page, cluster)
    for name in ("overview", "endpoints", "nodes"):
        page.goto(f"{cluster.url}{CONSOLE}" + ("" if name == "overview" else f"/{name}"))
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= 391, f"{name} is {width}px wide on a 390px phone"
        shot(page, f"phone-{name}")
    ctx.close()


def test_new_pages_at_phone_width_keyboard_only_and_as_viewer(browser, cluster):
    ctx, page = new_page(browser, 390, 844)
    sign_in(page, cluster)
    for path in ("/models/new", "/deployments/chat", "/endpoints/chat-openai", "/endpoints/chat-openai/try"):
        page.goto(f"{cluster.url}{CONSOLE}{path}")
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= 391, f"{path} is {width}px wide on a 390px phone"
        assert page.evaluate(CONTRAST_JS) == [], f"text below 4.5:1 contrast on {path}"
    shot(page, "phone-playground")
    ctx.close()
    ctx, page = new_page(browser)
    sign_in(page, cluster)
    page.goto(f"{cluster.url}{CONSOLE}/profiles/new")
    page.get_by_label("Name", exact=True).focus()  # then keyboard only: type, Tab between fields, Enter submits
    page.keyboard.type("kbd-p")
    for value in (None, "1", "24", None, None, "1", "1"):  # runtime, count, vram, model, mig, cpu, memory
        page.keyboard.press("Tab")
        if value is not None:
            page.keyboard.press("Control+A")
            page.keyboard.type(value)
    page.keyboard.press("Enter")
    expect(page.locator("main")).to_contain_text("kbd-p")
    ctx.close()
    ctx, page = new_page(browser)
    sign_in(page, cluster, "viewer", cluster.viewer_password)
    page.goto(f"{cluster.url}{CONSOLE}/models/new")
    expect(page.get_by_role("alert")).to_contain_text("read-only")
    expect(page.get_by_role("button", name="Add a model")).to_have_count(0)
    page.goto(f"{cluster.url}{CONSOLE}/deployments/chat")
    expect(page.get_by_role("button", name="Start rollout")).to_have_count(0)
    expect(page.get_by_role("button", name="Set autoscaling")).to_have_count(0)
    ctx.close()


def test_delete_drain_and_usage_keyboard_only_at_phone_width(browser, cluster):
    from tests.controlplane.console.test_console_daily import _idle_node

    with cluster.api() as api:
        assert api.post("/api/ai/profiles", json={"name": "kbd-del", "gpu": {"vram_gib": 24}, "cpu": 1,
                                                  "memory_gib": 1}).status_code == 201
        if api.get("/api/ai/nodes/idle-node").status_code == 404:
            _idle_node(cluster, api)
    ctx, page = new_page(browser, 390, 844)
    sign_in(page, cluster)
    for path in ("/usage", "/profiles/kbd-del/delete", "/nodes", "/profiles"):
        page.goto(f"{cluster.url}{CONSOLE}{path}")
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= 391, f"{path} is {width}px wide on a 390px phone"
        assert page.evaluate(CONTRAST_JS) == [], f"text below 4.5:1 contrast on {path}"
    # Delete, keyboard only: the list's link, then the confirmation's button.
    page.get_by_role("link", name="Delete kbd-del").focus()
    page.keyboard.press("Enter")
    expect(page.get_by_role("heading", name="Delete profile kbd-del?")).to_be_visible()
    shot(page, "phone-delete-confirm")
    page.get_by_role("button", name="Delete profile kbd-del").focus()
    page.keyboard.press("Enter")
    expect(page.get_by_test_id("message")).to_contain_text("profile kbd-del deleted")
    # Drain then uncordon a node: type the reason, Enter submits.
    page.goto(f"{cluster.url}{CONSOLE}/nodes")
    page.locator("#drain-idle-node").focus()
    page.keyboard.type("browser drain")
    page.keyboard.press("Enter")
    expect(page.get_by_test_id("message")).to_contain_text("node idle-node cordoned (browser drain)")
    page.get_by_role("button", name="Uncordon idle-node").focus()
    page.keyboard.press("Enter")
    expect(page.get_by_test_id("message")).to_contain_text("node idle-node open to new replicas")
    page.goto(f"{cluster.url}{CONSOLE}/usage")
    expect(page.get_by_role("heading", name="Room left per tenant")).to_be_visible()
    shot(page, "phone-usage")
    ctx.close()
