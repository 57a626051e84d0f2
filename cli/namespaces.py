"""`adapterctl namespaces create|list`."""

from __future__ import annotations

from typing import Any

import typer

from cli import output
from cli.client import ApiClient
from cli.invoke import call_and_emit
from cli.pagination import ALL_OPTION, CURSOR_OPTION, LIMIT_OPTION, list_pages

app = typer.Typer(help="Create and list namespaces.", no_args_is_help=True)


def create_namespace(client: ApiClient, name: str) -> Any:
    return client.post("/v1/namespaces", json={"name": name})


@app.command("create")
def create_command(ctx: typer.Context, name: str = typer.Argument(..., metavar="NAME")) -> None:
    """Create a namespace (admin on `*`); exit 4 if it already exists."""
    call_and_emit(ctx, output.render_namespace, lambda client: create_namespace(client, name))


@app.command("list")
def list_command(
    ctx: typer.Context,
    limit: int | None = LIMIT_OPTION,
    cursor: str | None = CURSOR_OPTION,
    all_pages: bool = ALL_OPTION,
) -> None:
    """List the namespaces this token can read."""
    list_pages(
        ctx,
        "/v1/namespaces",
        output.render_namespaces,
        limit=limit,
        cursor=cursor,
        all_pages=all_pages,
    )
