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
def list_command(ctx: typer.Context) -> None:
    """List namespaces."""
    cli = current(ctx)
    with cli.client() as client:
        page = client.get("/v1/namespaces")
    output.emit(cli, page, output.render_namespaces)
