"""`adapterctl gc [--dry-run]`: one blob garbage-collection pass (admin on `*`).

Removes the object-store blobs no artifact or collection references, written and leased
longer than the server's `ADAPTERPLANE_GC_GRACE_S` ago; `--dry-run` lists them and
removes nothing. `-o json` prints the API's report unchanged.
"""

from __future__ import annotations

from typing import Any

import typer
from rich.table import Table

from cli import output
from cli.invoke import call_and_emit


def render_gc_report(report: dict[str, Any]) -> None:
    verb = "would remove" if report.get("dry_run") else "removed"
    removed = report.get("removed") or []
    output.note(f"{verb} {len(removed)} blob(s), {report.get('removed_bytes', 0)} bytes "
                f"(scanned {report.get('scanned', 0)}; kept: {report.get('kept_referenced', 0)} "
                f"referenced, {report.get('kept_recent', 0)} within the "
                f"{report.get('grace_s', 0)} s grace, {report.get('kept_leased', 0)} leased)")
    if removed:
        table = Table(header_style="bold")
        for column in ("key", "bytes", "modified"):
            table.add_column(column, overflow="fold")
        for item in removed:
            table.add_row(str(item.get("key")), str(item.get("size_bytes")),
                          str(item.get("modified_at")))
        output.stdout_console().print(table)


def register(app: typer.Typer) -> None:
    @app.command("gc")
    def gc_command(
        ctx: typer.Context,
        dry_run: bool = typer.Option(False, "--dry-run",
                                     help="Report what would be removed; remove nothing."),
    ) -> None:
        """Remove unreferenced blobs older than the server's grace period (admin on `*`)."""
        call_and_emit(ctx, render_gc_report,
                      lambda client: client.post("/v1/gc", json={"dry_run": dry_run}))
