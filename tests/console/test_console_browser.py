"""The console in a real browser (headless Chromium through Playwright) against the
real API process: log in, find the alias, roll it back through the confirmation step,
see the new generation, open the rejected artifact; a read-only token sees no action;
forged POSTs (no CSRF token; a cross-site form) change nothing."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, BrowserContext, expect

from tests.console.browser import VIEWPORT, chromium, log_in
from tests.console.seed import ALIAS, NAMESPACE, Seeded, adapterctl


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as launched:
        yield launched


@pytest.fixture
def context(browser: Browser) -> Iterator[BrowserContext]:
    ctx = browser.new_context(viewport=VIEWPORT)  # type: ignore[arg-type]
    ctx.set_default_timeout(10_000)
    yield ctx
    ctx.close()


def generations(seeded: Seeded, alias: str = ALIAS) -> list[int]:
    history = adapterctl(seeded.url, seeded.admin, "history", f"{NAMESPACE}/{alias}")
    return [g["generation"] for g in history["items"]]


def test_rollback_through_confirmation_and_rejected_artifact(
        seeded: Seeded, context: BrowserContext) -> None:
    page = context.new_page()
    log_in(page, seeded.url, seeded.admin)
    page.get_by_role("link", name=NAMESPACE, exact=True).click()
    aliases = page.get_by_role("table")
    expect(aliases).to_contain_text(ALIAS)
    page.get_by_role("link", name=ALIAS, exact=True).click()

    history = page.get_by_role("table", name=f"Generations of {NAMESPACE}/{ALIAS}")
    expect(history.locator("tbody tr")).to_have_count(2)
    a, b = seeded.artifacts["a"], seeded.artifacts["b"]
    expect(history).to_contain_text(b["digest"])
    expect(history).to_contain_text("rank-2 retune")
    # the default diff compares generation 1 (rank 4) with generation 2 (rank 2)
    diff = page.get_by_role("table", name="adapter_config.json", exact=False)
    rows = {row.locator("th").inner_text(): row.locator("td").all_inner_texts()
            for row in diff.locator("tbody tr").all()}
    assert rows["r"] == ["changed", "4", "2"] and rows["lora_alpha"] == ["changed", "8", "4"]
    assert rows["target_modules"][0] == "changed"

    page.get_by_role("link", name="Roll back…").click()
    expect(page.get_by_role("heading", level=1)).to_contain_text("Confirm rollback")
    expect(page.locator("dl.facts")).to_contain_text(f"#{a['id']}")
    assert generations(seeded) == [2, 1]  # the confirmation page changed nothing
    page.get_by_label("Reason").fill("regression in v2")
    page.get_by_role("button", name="Confirm rollback").click()

    expect(page.get_by_role("status")).to_have_text("Generation 3 appended.")
    newest = history.locator("tbody tr").first
    expect(newest).to_contain_text("rollback")
    expect(newest).to_contain_text("regression in v2")
    expect(newest).to_contain_text(a["digest"])
    resolved = adapterctl(seeded.url, seeded.admin, "resolve", f"{NAMESPACE}/{ALIAS}")
    assert (resolved["generation"], resolved["artifact"]["id"]) == (3, a["id"])

    rejected = seeded.artifacts["nan"]
    page.get_by_role("navigation", name=f"Namespace {NAMESPACE}").get_by_role(
        "link", name="Artifacts").click()
    page.get_by_role("link", name=f"#{rejected['id']}", exact=True).click()
    section = page.get_by_role("region", name="Rejected")
    expect(section).to_contain_text("non_finite")
    expect(section).to_contain_text(rejected["rejection"]["message"])


def test_read_only_token_sees_no_action_buttons(seeded: Seeded,
                                                context: BrowserContext) -> None:
    page = context.new_page()
    log_in(page, seeded.url, seeded.reader, f"/ui/namespaces/{NAMESPACE}/aliases/{ALIAS}")
    expect(page.get_by_role("table", name=f"Generations of {NAMESPACE}/{ALIAS}")).to_be_visible()
    for name in ("Roll back…", "Retire…"):
        expect(page.get_by_role("link", name=name)).to_have_count(0)
    expect(page.get_by_role("button", name="Review publish…")).to_have_count(0)
    buttons = page.get_by_role("button").all_inner_texts()
    assert sorted(buttons) == ["Compare", "Log out"]


def test_forged_posts_are_refused(seeded: Seeded, context: BrowserContext) -> None:
    page = context.new_page()
    log_in(page, seeded.url, seeded.admin)
    before = generations(seeded)
    target = f"{seeded.url}/ui/namespaces/{NAMESPACE}/aliases/{ALIAS}/retire"
    # with the session cookie but without the form's CSRF token
    forged = page.request.post(target, form={"expected_generation": str(before[0])})
    assert forged.status == 403 and "CSRF_REJECTED" in forged.text()
    # a cross-site page auto-submitting a form: the SameSite=Strict cookie is not sent
    other = context.new_page()
    other.set_content(f'<form method="post" action="{target}">'
                      f'<input name="expected_generation" value="{before[0]}"></form>')
    with other.expect_navigation():
        other.evaluate("document.forms[0].submit()")
    expect(other.get_by_role("heading", level=1)).to_contain_text("401")
    assert generations(seeded) == before


def test_keyboard_reaches_the_skip_link_first(seeded: Seeded, context: BrowserContext) -> None:
    page = context.new_page()
    log_in(page, seeded.url, seeded.admin)
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Skip to content"
    page.keyboard.press("Enter")
    assert page.url.endswith("#main")


def test_agents_live_numbers_load_and_poll_under_the_csp(
        seeded: Seeded, context: BrowserContext) -> None:
    seeded.heartbeat()
    page = context.new_page()
    problems: list[str] = []
    page.on("console", lambda msg: problems.append(msg.text) if msg.type == "error" else None)
    log_in(page, seeded.url, seeded.admin, "/ui/agents")
    live = page.locator("#live")
    expect(live.get_by_role("row", name="gpu-b")).to_contain_text("unavailable")
    expect(live.get_by_role("row", name="gpu-a")).to_contain_text("75.0 %")
    # htmx polls again within its interval (5 s), with the session cookie
    with page.expect_response(lambda r: r.url.endswith("/ui/agents/live"),
                              timeout=7_000) as polled:
        pass
    assert polled.value.status == 200
    assert problems == []  # no script or style refused by the Content-Security-Policy
