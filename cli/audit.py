"""`adapterctl audit`: the append-only audit log (admin)."""

from __future__ import annotations

import typer

from cli import output
from cli.context import current


def register(app: typer.Typer) -> None:
    @app.command("audit")
    def audit_command(
        ctx: typer.Context,
        namespace: str | None = typer.Option(None, "--namespace", "-n"),
        limit: int | None = typer.Option(None, "--limit", min=1),
        cursor: str | None = typer.Option(None, "--cursor"),
        all_pages: bool = typer.Option(False, "--all", help="Follow next_cursor to the end."),
    ) -> None:
        """Show audit entries, newest first (admin on `*`, or on NS with --namespace)."""
        cli = current(ctx)
        with cli.client() as client:
            page = client.paginate(
                "/v1/audit",
                params={"namespace": namespace, "limit": limit, "cursor": cursor},
                follow=all_pages,
            )
        output.emit(cli, page, output.render_audit)
