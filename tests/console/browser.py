"""Playwright on Debian's Chromium, headless (`playwright install` is not used: the
browser is the system's `/usr/bin/chromium`, `apt-get install chromium`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from playwright.sync_api import Browser, Page, sync_playwright

CHROMIUM = "/usr/bin/chromium"
VIEWPORT = {"width": 1366, "height": 768}


@contextmanager
def chromium() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            yield browser
        finally:
            browser.close()


def log_in(page: Page, url: str, token: str, path: str = "/ui/namespaces") -> None:
    """Open `path` logged out, land on the login form, paste the token, come back."""
    page.goto(url + path)
    page.get_by_label("API token").fill(token)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(url + path)
