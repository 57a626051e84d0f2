"""`adapterctl audit`: the append-only audit log (admin)."""

from __future__ import annotations

import typer

from cli import output
from cli.pagination import ALL_OPTION, CURSOR_OPTION, LIMIT_OPTION, list_pages


def register(app: typer.Typer) -> None:
    @app.command("audit")
    def audit_command(
        ctx: typer.Context,
        namespace: str | None = typer.Option(None, "--namespace", "-n"),
        limit: int | None = LIMIT_OPTION,
        cursor: str | None = CURSOR_OPTION,
        all_pages: bool = ALL_OPTION,
    ) -> None:
        """Show audit entries, newest first (admin on `*`, or on NS with --namespace)."""
        list_pages(
            ctx,
            "/v1/audit",
            output.render_audit,
            filters={"namespace": namespace},
            limit=limit,
            cursor=cursor,
            all_pages=all_pages,
        )
