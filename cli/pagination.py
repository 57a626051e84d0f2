"""Keyset-paginated list commands: the shared `--limit/--cursor/--all` options and runner.

Every list command GETs `{"items", "next_cursor"}` with its own filters plus `limit` and
`cursor` (None values are not sent). Without `--all` it prints that one page (table mode
hints `more: --cursor C` on stderr); with `--all` it follows `next_cursor` and prints one
`{"items": every item, "next_cursor": None}`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import typer

from cli import output
from cli.invoke import call_and_emit

LIMIT_OPTION = typer.Option(None, "--limit", min=1)
CURSOR_OPTION = typer.Option(None, "--cursor")
ALL_OPTION = typer.Option(False, "--all", help="Follow next_cursor to the end.")


def list_pages(
    ctx: typer.Context,
    path: str,
    renderer: output.Renderer,
    *,
    limit: int | None,
    cursor: str | None,
    all_pages: bool,
    filters: Mapping[str, Any] | None = None,
) -> None:
    """Fetch the list at `path` (one page, or every page with `all_pages`) and print it.

    `filters` are extra query parameters sent before `limit` and `cursor` on every page.
    """
    params = {**(filters or {}), "limit": limit, "cursor": cursor}
    call_and_emit(
        ctx, renderer, lambda client: client.paginate(path, params=params, follow=all_pages)
    )
