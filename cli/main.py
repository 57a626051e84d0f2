"""`adapterctl`: the admin CLI of Adapterplane (Typer app; console script `cli.main:app`).

Global options (`--url`, `--token`, `--output`, `--timeout`) precede the command:
`adapterctl --output json resolve acme/support-bot`. Every failure prints
`error: <CODE>: <message>` on stderr and exits with the stable code documented in
`cli.errors` (3 not found, 4 conflict, 5 invalid/rejected, 6 auth, 7 unreachable, ...).
"""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperGroup

from cli import (
    agents,
    artifacts,
    audit,
    bases,
    catalog,
    collections,
    gc,
    merges,
    namespaces,
    output,
    tokens,
)
from cli.client import DEFAULT_TIMEOUT_S, DEFAULT_URL, TOKEN_ENV, URL_ENV
from cli.context import CliContext, OutputFormat
from cli.errors import CliError


class ErrorMappingGroup(TyperGroup):
    """Root group that turns a `CliError` from any command into message + exit code."""

    def invoke(self, ctx: typer.Context) -> Any:  # type: ignore[override]
        try:
            return super().invoke(ctx)
        except CliError as error:
            output.print_error(error)
            ctx.exit(int(error.exit_code))


app = typer.Typer(
    name="adapterctl",
    cls=ErrorMappingGroup,
    help="Push, validate, publish and roll back LoRA adapters on an Adapterplane control plane.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def root(
    ctx: typer.Context,
    url: str = typer.Option(DEFAULT_URL, "--url", envvar=URL_ENV, help="Control-plane URL."),
    token: str | None = typer.Option(
        None, "--token", envvar=TOKEN_ENV, help="API token (Bearer).", show_default=False
    ),
    output_format: OutputFormat = typer.Option(
        OutputFormat.TABLE,
        "--output",
        "-o",
        case_sensitive=False,
        help="table for humans, json for the API's exact JSON.",
    ),
    timeout: float = typer.Option(
        DEFAULT_TIMEOUT_S, "--http-timeout", help="Per-request HTTP timeout in seconds."
    ),
) -> None:
    ctx.obj = CliContext(url=url, token=token, output=output_format, timeout_s=timeout)


app.command("push")(artifacts.push_command)
catalog.register(app)
audit.register(app)
gc.register(app)
app.add_typer(agents.app, name="agents")
app.add_typer(artifacts.app, name="artifacts")
app.add_typer(bases.app, name="bases")
app.add_typer(collections.app, name="collections")
app.add_typer(merges.app, name="merges")
app.add_typer(namespaces.app, name="namespaces")
app.add_typer(tokens.app, name="tokens")


def main() -> None:
    """Entry point equivalent to the console script."""
    app()


if __name__ == "__main__":
    main()
