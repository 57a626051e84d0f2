"""`adapterctl namespaces create|list`."""

from __future__ import annotations

from typing import Any

import typer

from cli import output
from cli.client import ApiClient
from cli.context import current

app = typer.Typer(help="Create and list namespaces.", no_args_is_help=True)


def create_namespace(client: ApiClient, name: str) -> Any:
    return client.post("/v1/namespaces", json={"name": name})


@app.command("create")
def create_command(ctx: typer.Context, name: str = typer.Argument(..., metavar="NAME")) -> None:
    """Create a namespace (admin on `*`); exit 4 if it already exists."""
    cli = current(ctx)
    with cli.client() as client:
        namespace = create_namespace(client, name)
    output.emit(cli, namespace, output.render_namespace)


@app.command("list")
def list_command(
    ctx: typer.Context,
    limit: int | None = typer.Option(None, "--limit", min=1),
    cursor: str | None = typer.Option(None, "--cursor"),
    all_pages: bool = typer.Option(False, "--all", help="Follow next_cursor to the end."),
) -> None:
    """List the namespaces this token can read."""
    cli = current(ctx)
    with cli.client() as client:
        page = client.paginate(
            "/v1/namespaces", params={"limit": limit, "cursor": cursor}, follow=all_pages
        )
    output.emit(cli, page, output.render_namespaces)
