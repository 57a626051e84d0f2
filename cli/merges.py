"""`adapterctl merges create|list|show`: immutable merged releases.

`create` merges an ordered list of validated adapters (`-a REF`, or `-a REF@WEIGHT` with
an exact weight such as `1/2`) into their base, read by the worker from `--base-uri`
(s3:// or file://); the result is a new base revision with its lineage (`adapterctl bases
show` prints it). `--wait` polls until `merged` or `rejected` (exit 5 with the rejection
code, e.g. `merge_inexact` when the exactness gate refuses the release).
"""

from __future__ import annotations

import time
from typing import Any

import typer

from cli import output
from cli.artifacts import resolve_base
from cli.client import ApiClient, segment
from cli.context import current
from cli.errors import CliError, ExitCode, usage_error
from cli.invoke import call_and_emit
from cli.pagination import ALL_OPTION, CURSOR_OPTION, LIMIT_OPTION, list_pages

TERMINAL_STATES = frozenset({"merged", "rejected"})
DEFAULT_WAIT_TIMEOUT_S = 3600.0
WEIGHT_SEPARATOR = "@"

app = typer.Typer(help="Merge adapters into their base as immutable releases.",
                  no_args_is_help=True)


def _root(namespace: str) -> str:
    return f"/v1/namespaces/{segment(namespace)}/merges"


def adapter_item(text: str) -> dict[str, str]:
    """`REF` or `REF@WEIGHT` -> the API's `{"artifact", "weight"}`."""
    ref, sep, weight = text.partition(WEIGHT_SEPARATOR)
    if not ref or (sep and not weight):
        raise usage_error(f"adapter {text!r}: expected REF or REF@WEIGHT")
    return {"artifact": ref, "weight": weight or "1"}


def wait_for_merge(client: ApiClient, namespace: str, ref: str, *, timeout_s: float
                   ) -> dict[str, Any]:
    """Poll until `merged` or `rejected` (CliError WAIT_TIMEOUT, exit 9, after timeout_s)."""
    deadline = time.monotonic() + timeout_s
    delay, last = 0.25, None
    while True:
        merge: dict[str, Any] = client.get(f"{_root(namespace)}/{segment(ref)}")
        state = str(merge.get("state"))
        if state != last:
            output.note(f"  state: {state}")
        last = state
        if state in TERMINAL_STATES:
            return merge
        if time.monotonic() + delay > deadline:
            raise CliError("WAIT_TIMEOUT", f"merge {ref} still {state} after {timeout_s:g}s")
        time.sleep(delay)
        delay = min(delay * 1.5, 2.0)


def render_adapters(adapters: list[dict[str, Any]]) -> None:
    output._table("adapters (merge order)", ["#", "artifact", "digest", "weight"],
                  [(i, a.get("artifact_id"), output.short(a.get("digest")), a.get("weight"))
                   for i, a in enumerate(adapters)])


def render_merge(merge: dict[str, Any]) -> None:
    metrics = merge.get("metrics") or {}
    rejection = merge.get("rejection") or {}
    output._fields(f"merge {merge.get('id')}", [
        ("namespace", merge.get("namespace")),
        ("name", merge.get("name")),
        ("state", merge.get("state")),
        ("h_merged", merge.get("digest")),
        ("merged base", merge.get("merged_base")),
        ("source base", merge.get("base")),
        ("dtype", merge.get("dtype")),
        ("max_relative_error", metrics.get("max_relative_error")),
        ("threshold", (merge.get("spec") or {}).get("max_relative_error")),
        ("size_bytes", merge.get("size_bytes")),
        ("rejection", f"{rejection.get('code')}: {rejection.get('message')}"
         if rejection else None),
        ("merge_attempts", merge.get("merge_attempts")),
        ("last_error", merge.get("last_error")),
        ("created_at", merge.get("created_at")),
        ("merged_at", merge.get("merged_at")),
    ])
    render_adapters(list(merge.get("adapters") or []))


def render_merges(page: dict[str, Any]) -> None:
    rows = [(m.get("id"), m.get("name"), m.get("state"), m.get("dtype"),
             len(m.get("adapters") or []), output.short(m.get("digest")),
             output.short(m.get("merged_base")), m.get("created_at"))
            for m in page.get("items", [])]
    output._table("merges", ["id", "name", "state", "dtype", "adapters", "h_merged",
                             "merged base", "created"], rows, empty="no merged releases")
    if page.get("next_cursor"):
        output.note(f"more: --cursor {page['next_cursor']}")


def render_lineage(lineage: list[dict[str, Any]]) -> None:
    """What `bases show` adds for a merged base: its source base and ordered adapters."""
    for merge in lineage:
        output._fields("lineage", [
            ("merge", f"{merge.get('namespace')}/{merge.get('id')} ({merge.get('name')})"),
            ("h_merged", merge.get("digest")),
            ("source base", merge.get("base")),
            ("dtype", merge.get("dtype")),
        ])
        render_adapters(list(merge.get("adapters") or []))


@app.command("create")
def create_command(
    ctx: typer.Context,
    namespace: str = typer.Argument(..., metavar="NS"),
    base: str = typer.Option(..., "--base", "-b", help="Source h_base (or registered name)."),
    adapters: list[str] = typer.Option(..., "--adapter", "-a",
                                       help="REF or REF@WEIGHT (id or sha256:<H_artifact>; "
                                            "weight e.g. 1/2); repeat, in merge order."),
    dtype: str = typer.Option(..., "--dtype", help="bf16 | fp16 | fp32"),
    name: str = typer.Option(..., "--name", help="A label for the release."),
    base_uri: str = typer.Option(..., "--base-uri",
                                 help="s3:// or file:// of the source base checkpoint."),
    max_relative_error: str | None = typer.Option(
        None, "--max-relative-error", help="Exactness-gate threshold (default per dtype)."),
    wait: bool = typer.Option(False, "--wait", help="Wait until merged or rejected."),
    timeout: float = typer.Option(DEFAULT_WAIT_TIMEOUT_S, "--timeout"),
) -> None:
    """Submit a merged release; with --wait, exit 5 with the rejection code if rejected."""
    cli = current(ctx)
    items = [adapter_item(a) for a in adapters]
    with cli.client() as client:
        body: dict[str, Any] = {"name": name, "base": resolve_base(client, base),
                                "adapters": items, "dtype": dtype, "base_uri": base_uri}
        if max_relative_error is not None:
            body["max_relative_error"] = max_relative_error
        merge: dict[str, Any] = client.post(_root(namespace), json=body)
        if wait and merge.get("state") not in TERMINAL_STATES:
            output.note(f"submitted merge {merge.get('id')}; waiting for the release")
            merge = wait_for_merge(client, namespace, str(merge["id"]), timeout_s=timeout)
    output.emit(cli, merge, render_merge)
    if wait and merge.get("state") == "rejected":
        rejection = merge.get("rejection") or {}
        raise CliError(str(rejection.get("code") or "MERGE_REJECTED"),
                       str(rejection.get("message") or "merge rejected"),
                       detail=rejection.get("detail"), exit_code=ExitCode.INVALID)


@app.command("list")
def list_command(
    ctx: typer.Context,
    namespace: str = typer.Argument(..., metavar="NS"),
    state: str | None = typer.Option(None, "--state", help="pending|merging|merged|rejected"),
    limit: int | None = LIMIT_OPTION,
    cursor: str | None = CURSOR_OPTION,
    all_pages: bool = ALL_OPTION,
) -> None:
    """List a namespace's merged releases (newest first)."""
    list_pages(ctx, _root(namespace), render_merges, filters={"state": state},
               limit=limit, cursor=cursor, all_pages=all_pages)


@app.command("show")
def show_command(
    ctx: typer.Context,
    namespace: str = typer.Argument(..., metavar="NS"),
    ref: str = typer.Argument(..., metavar="REF", help="Merge id or sha256:<H_merged>."),
) -> None:
    """Show one merged release: lineage, gate metrics, the released base."""
    call_and_emit(ctx, render_merge,
                  lambda client: client.get(f"{_root(namespace)}/{segment(ref)}"))
