"""The body every `adapterctl` command shares: one API call, then print its answer.

A command resolves its arguments, then calls `call_and_emit` with a `request` that
takes the invocation's `ApiClient` (opened from the global `--url/--token/--http-timeout`
and closed before printing) and returns the decoded API body. Errors raised by `request`
(`CliError`, `ApiError`) propagate unchanged, so exit codes are those of `cli.errors`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import typer

from cli import output
from cli.client import ApiClient
from cli.context import current

ApiRequest = Callable[[ApiClient], Any]


def call_and_emit(ctx: typer.Context, renderer: output.Renderer, request: ApiRequest) -> None:
    """Run `request` on a fresh client, then print its result as JSON or via `renderer`."""
    cli = current(ctx)
    with cli.client() as client:
        data = request(client)
    output.emit(cli, data, renderer)
