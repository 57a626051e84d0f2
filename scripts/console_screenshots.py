"""Screenshots of the web console's main pages for docs/CONSOLE.md.

    .venv/bin/python scripts/console_screenshots.py [--out docs/img]

Starts a self-contained control plane (`EmbeddedStack`: SQLite, file:// objects, one API
and one worker process in a temporary directory), seeds it as the browser tests do
(tests/console/seed.py: alias `demo/bot` with two generations, a rejected artifact, two
agents), and photographs each page with headless Chromium (Debian's, /usr/bin/chromium)
at 1366×768: docs/img/console-{aliases,alias,artifact,agents,audit}.png.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cli.stack import EmbeddedStack, free_port  # noqa: E402
from tests.console.browser import VIEWPORT, chromium, log_in  # noqa: E402
from tests.console.seed import ALIAS, NAMESPACE, Seeded, seed  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    out: Path = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="console-shots-") as tmp:
        stack = EmbeddedStack(Path(tmp) / "stack", port=0, embedded_only=True)
        with stack:
            seeded = seed(stack.url, stack.token(), Path(tmp) / "assets", free_port(),
                          free_port())
            try:
                shoot(stack.url, seeded, out)
            finally:
                seeded.metrics_server.shutdown()


def shoot(url: str, seeded: Seeded, out: Path) -> None:
    rejected_id = seeded.artifacts["nan"]["id"]
    with chromium() as browser:
        page = browser.new_page(viewport=VIEWPORT)  # type: ignore[arg-type]
        log_in(page, url, seeded.admin)
        pages = {
            "aliases": f"/ui/namespaces/{NAMESPACE}/aliases",
            "alias": f"/ui/namespaces/{NAMESPACE}/aliases/{ALIAS}",
            "artifact": f"/ui/namespaces/{NAMESPACE}/artifacts/{rejected_id}",
            "audit": "/ui/audit",
        }
        for name, path in pages.items():
            page.goto(url + path)
            page.screenshot(path=str(out / f"console-{name}.png"), full_page=True)
            print(out / f"console-{name}.png")
        page.goto(url + "/ui/agents")
        page.locator("#live table").wait_for()
        # traffic, then a second poll (what the next `every 5s` tick does): a request rate
        for _ in range(12):
            seeded.metrics.admitted.labels("le8").inc()
        page.wait_for_timeout(1000)
        page.evaluate("htmx.ajax('GET', '/ui/agents/live', '#live')")
        page.get_by_text("measuring…").wait_for(state="detached")
        page.screenshot(path=str(out / "console-agents.png"), full_page=True)
        print(out / "console-agents.png")


if __name__ == "__main__":
    main()
