"""`adapterctl namespaces create|list|set-weight|set-priority`."""

from __future__ import annotations

import math
from enum import StrEnum
from typing import Any

import typer

from cli import output
from cli.client import ApiClient, segment
from cli.errors import usage_error
from cli.invoke import call_and_emit
from cli.pagination import ALL_OPTION, CURSOR_OPTION, LIMIT_OPTION, list_pages

app = typer.Typer(help="Create and list namespaces; set their scheduling policy.",
                  no_args_is_help=True)


class Priority(StrEnum):
    """Scheduling priority classes, most urgent first."""

    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"


def create_namespace(client: ApiClient, name: str) -> Any:
    return client.post("/v1/namespaces", json={"name": name})


def patch_namespace(client: ApiClient, name: str, **policy: Any) -> Any:
    return client.patch(f"/v1/namespaces/{segment(name)}", json=policy)


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
    """List the namespaces this token can read, with their weight and priority."""
    list_pages(
        ctx,
        "/v1/namespaces",
        output.render_namespaces,
        limit=limit,
        cursor=cursor,
        all_pages=all_pages,
    )


@app.command("set-weight")
def set_weight_command(
    ctx: typer.Context,
    name: str = typer.Argument(..., metavar="NAME"),
    weight: float = typer.Argument(..., metavar="WEIGHT", help="0 < WEIGHT <= 1000 (default 1)."),
) -> None:
    """Set a namespace's scheduling weight on every agent (admin on `*`).

    Requests get engine service in proportion to WEIGHT. Exit 5: out of range; 3: unknown.
    """
    if not math.isfinite(weight):  # JSON has no NaN/Infinity: refused before sending
        raise usage_error(f"WEIGHT must be a finite number, got {weight}")
    call_and_emit(ctx, output.render_namespace,
                  lambda client: patch_namespace(client, name, weight=weight))


@app.command("set-priority")
def set_priority_command(
    ctx: typer.Context,
    name: str = typer.Argument(..., metavar="NAME"),
    priority: Priority = typer.Argument(..., metavar="{high,normal,low}", case_sensitive=False),
) -> None:
    """Set a namespace's scheduling priority class on every agent (admin on `*`).

    A more urgent class (high < normal < low) is admitted first. Exit 3: unknown namespace.
    """
    call_and_emit(ctx, output.render_namespace,
                  lambda client: patch_namespace(client, name, priority=priority.value))
