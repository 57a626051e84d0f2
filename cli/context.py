"""Per-invocation state shared by every `adapterctl` command (global options)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import typer

from cli.client import ApiClient


class OutputFormat(StrEnum):
    """`table`: rich tables for humans; `json`: the API's JSON, unchanged, on stdout."""

    TABLE = "table"
    JSON = "json"


@dataclass(frozen=True)
class CliContext:
    """Global options resolved once by the root callback.

    `url`/`token` come from `--url`/`--token` or `ADAPTERPLANE_URL`/`ADAPTERPLANE_TOKEN`.
    """

    url: str
    token: str | None
    output: OutputFormat
    timeout_s: float

    def client(self) -> ApiClient:
        return ApiClient(self.url, self.token or "", timeout=self.timeout_s)


def current(ctx: typer.Context) -> CliContext:
    """The `CliContext` the root callback stored on the Click context tree."""
    obj = ctx.find_root().obj
    if not isinstance(obj, CliContext):  # only when a command is invoked without the root
        raise RuntimeError("adapterctl command invoked outside the root application")
    return obj
