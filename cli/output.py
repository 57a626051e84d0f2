"""Rendering of API objects: the API's JSON unchanged (`--output json`) or rich tables.

JSON mode prints exactly the decoded API body (indent 2) on stdout and nothing else, so
pipelines can parse it. Table mode is for humans and may abbreviate (digests are shown
as their first 12 hex digits). Errors always go to stderr as `error: <CODE>: <message>`.
Renderers read fields defensively (`.get`) so a server that adds fields never breaks them.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from cli.context import CliContext, OutputFormat
from cli.errors import CliError, shown_code

Renderer = Callable[[Any], None]


def stdout_console() -> Console:
    """A console on the *current* stdout (Click's test runner swaps it per invocation)."""
    width = None if sys.stdout.isatty() else int(os.environ.get("COLUMNS", "160"))
    return Console(file=sys.stdout, width=width, soft_wrap=False)


def stderr_console() -> Console:
    return Console(file=sys.stderr, width=None if sys.stderr.isatty() else 160)


def emit(cli: CliContext, data: Any, renderer: Renderer) -> None:
    """Print `data` as JSON or through `renderer`, according to `--output`."""
    if cli.output is OutputFormat.JSON:
        print_json(data)
    else:
        renderer(data)


def print_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, ensure_ascii=False))


def print_error(error: CliError) -> None:
    """`error: <CODE>: <message>` on stderr (plain text: CI logs grep it)."""
    typer.echo(f"error: {shown_code(error.code)}: {error.message}", err=True)


def note(message: str) -> None:
    """Progress and hints for humans, on stderr so stdout stays parseable."""
    typer.echo(message, err=True)


def short(digest: Any, n: int = 12) -> str:
    """`sha256:<hex>` or `<hex>` abbreviated to `n` hex digits; '-' for None."""
    if not digest:
        return "-"
    text = str(digest)
    prefix, _, tail = text.rpartition(":")
    return f"{prefix + ':' if prefix else ''}{tail[:n]}"


def _cell(value: Any) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def _table(
    title: str | None,
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    empty: str | None = None,
) -> None:
    """A rich table on stdout; with no rows and an `empty` note, that note on stderr instead.

    An empty table reads as "nothing happened"; the note says what is absent.
    """
    if not rows and empty is not None:
        note(empty)
        return
    table = Table(title=title, show_lines=False, header_style="bold")
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*(_cell(v) for v in row))
    stdout_console().print(table)


def _fields(title: str, pairs: Sequence[tuple[str, Any]]) -> None:
    table = Table(title=title, show_header=False, box=None, pad_edge=False)
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    for key, value in pairs:
        table.add_row(key, _cell(value))
    stdout_console().print(table)


def _next_cursor(page: dict[str, Any]) -> None:
    if page.get("next_cursor"):
        note(f"more: --cursor {page['next_cursor']}")


def _artifact_ref(summary: Any) -> str:
    if not isinstance(summary, dict):
        return "-"
    digest = summary.get("digest")
    ident = summary.get("id")
    return f"{ident} ({short(digest)})" if digest else _cell(ident)


def _target_ref(gen: dict[str, Any]) -> str:
    """What a generation serves: its artifact, its merged release, or `-` (retired)."""
    release = gen.get("release")
    if isinstance(release, dict):
        return f"release {release.get('id')} ({short(release.get('digest'))})"
    return _artifact_ref(gen.get("artifact"))


def _activation(artifact: dict[str, Any]) -> str | None:
    """"always on", or an activated LoRA's invocation token ids (None before validation)."""
    record = artifact.get("validated_record")
    if not isinstance(record, dict):
        return None
    tokens = record.get("alora_invocation_tokens")
    return "always on" if tokens is None else f"aLoRA, invoked by tokens {tokens}"


def _rejection_code(rejection: Any) -> str | None:
    """A rejection's code as every error is printed (upper case); None without one."""
    code = rejection.get("code") if isinstance(rejection, dict) else None
    return shown_code(str(code)) if code else None


def _rejection(rejection: dict[str, Any]) -> str | None:
    if not rejection:
        return None
    return f"{_rejection_code(rejection)}: {rejection.get('message')}"


def render_artifact(artifact: dict[str, Any]) -> None:
    rejection = artifact.get("rejection") or {}
    modules = artifact.get("modules")
    _fields(
        f"artifact {artifact.get('id')}",
        [
            ("namespace", artifact.get("namespace")),
            ("state", artifact.get("state")),
            ("digest", artifact.get("digest")),
            ("base", artifact.get("base")),
            ("method", artifact.get("method")),
            ("size_bytes", artifact.get("size_bytes")),
            ("modules", len(modules) if isinstance(modules, list) else None),
            ("activation", _activation(artifact)),
            ("upload_sha256", artifact.get("upload_sha256")),
            (
                "rejection",
                _rejection(rejection),
            ),
            ("validation_attempts", artifact.get("validation_attempts")),
            ("last_error", artifact.get("last_error")),
            ("created_at", artifact.get("created_at")),
            ("validated_at", artifact.get("validated_at")),
        ],
    )


def render_artifacts(page: dict[str, Any]) -> None:
    rows = [
        (
            a.get("id"),
            a.get("state"),
            short(a.get("digest")),
            short(a.get("base")),
            a.get("method"),
            a.get("size_bytes"),
            _rejection_code(a.get("rejection")),
            a.get("created_at"),
        )
        for a in page.get("items", [])
    ]
    _table(
        "artifacts",
        ["id", "state", "digest", "base", "method", "bytes", "rejection", "created"],
        rows,
        empty="no artifacts",
    )
    _next_cursor(page)


def render_generation(gen: dict[str, Any]) -> None:
    pairs: list[tuple[str, Any]] = [
        ("alias", f"{gen.get('namespace')}/{gen.get('alias')}"),
        ("generation", gen.get("generation")),
        ("action", gen.get("action")),
        ("serves", _target_ref(gen)),
    ]
    if "base" in gen:
        pairs.append(("base", gen.get("base")))
    if "hot" in gen:
        pairs.append(("hot", gen.get("hot")))
    pairs += [
        ("actor", gen.get("actor")),
        ("reason", gen.get("reason")),
        ("created_at", gen.get("created_at")),
    ]
    _fields(f"{gen.get('namespace')}/{gen.get('alias')} @ {gen.get('generation')}", pairs)


def _generation_rows(items: Sequence[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [
        (
            g.get("generation"),
            g.get("action"),
            _target_ref(g),
            g.get("actor"),
            g.get("reason"),
            g.get("created_at"),
        )
        for g in items
    ]


def render_history(page: dict[str, Any]) -> None:
    items = page.get("items", [])
    title = f"history {items[0].get('namespace')}/{items[0].get('alias')}" if items else "history"
    _table(
        title,
        ["gen", "action", "serves", "actor", "reason", "created"],
        _generation_rows(items),
        empty="no generations",
    )
    _next_cursor(page)


def render_aliases(page: dict[str, Any]) -> None:
    rows = [
        (
            g.get("alias"),
            g.get("generation"),
            g.get("action"),
            _target_ref(g),
            short(g.get("base")),
            g.get("hot"),
            g.get("created_at"),
        )
        for g in page.get("items", [])
    ]
    _table(
        "aliases",
        ["alias", "gen", "action", "serves", "base", "hot", "updated"],
        rows,
        empty="no aliases published",
    )
    _next_cursor(page)


def render_base(base: dict[str, Any]) -> None:
    _fields(
        f"base {base.get('name')}",
        [
            ("id", base.get("id")),
            ("h_base", base.get("h_base")),
            ("architecture", base.get("architecture")),
            ("created_at", base.get("created_at")),
        ],
    )


def render_bases(page: dict[str, Any]) -> None:
    rows = [
        (b.get("name"), b.get("h_base"), b.get("architecture"), b.get("created_at"))
        for b in page.get("items", [])
    ]
    _table(
        "bases", ["name", "h_base", "architecture", "created"], rows,
        empty="no base models registered",
    )
    _next_cursor(page)


def render_namespace(namespace: dict[str, Any]) -> None:
    _fields(f"namespace {namespace.get('name')}", list(namespace.items()))


def render_namespaces(page: dict[str, Any]) -> None:
    items = page.get("items", [])
    rows = [(n.get("name"), n.get("id"), n.get("weight"), n.get("priority"), n.get("created_at"))
            for n in items]
    _table(
        "namespaces", ["name", "id", "weight", "priority", "created"], rows,
        empty="no namespaces",
    )
    _next_cursor(page)


def render_token(token: dict[str, Any]) -> None:
    grants = ", ".join(f"{g.get('namespace')}:{g.get('role')}" for g in token.get("grants", []))
    pairs: list[tuple[str, Any]] = [
        ("id", token.get("id")),
        ("grants", grants),
        ("is_agent", token.get("is_agent")),
    ]
    if "revoked" in token:
        pairs.append(("revoked", token.get("revoked")))
    _fields(f"token {token.get('name')}", pairs)
    if token.get("token"):
        # The plaintext is shown once by the server: alone on its stdout line, easy to capture.
        note("token (shown once, store it now):")
        typer.echo(token["token"])


def render_audit(page: dict[str, Any]) -> None:
    rows = [
        (
            e.get("created_at"),
            e.get("actor"),
            e.get("action"),
            e.get("namespace"),
            e.get("target"),
            e.get("detail"),
        )
        for e in page.get("items", [])
    ]
    _table(
        "audit", ["time", "actor", "action", "namespace", "target", "detail"], rows,
        empty="no audit events",
    )
    _next_cursor(page)


def render_collection(collection: dict[str, Any]) -> None:
    rejection = collection.get("rejection") or {}
    metrics = collection.get("metrics") or {}
    spec = collection.get("spec") or {}
    params = metrics.get("params") or {}
    _fields(
        f"collection {collection.get('id')}",
        [
            ("namespace", collection.get("namespace")),
            ("name", collection.get("name")),
            ("state", collection.get("state")),
            ("digest", collection.get("digest")),
            ("base", collection.get("base")),
            ("members", len(collection.get("sources") or [])),
            ("spec", " ".join(f"{k}={v}" for k, v in sorted(spec.items()))),
            ("assignment", collection.get("assignment")),
            ("max_relative_error", metrics.get("max_relative_error")),
            ("params lora -> joint", f"{params.get('lora')} -> {params.get('joint')}"
             if params else None),
            ("size_bytes", collection.get("size_bytes")),
            (
                "rejection",
                _rejection(rejection),
            ),
            ("fit_attempts", collection.get("fit_attempts")),
            ("last_error", collection.get("last_error")),
            ("created_at", collection.get("created_at")),
            ("fitted_at", collection.get("fitted_at")),
        ],
    )


def render_collections(page: dict[str, Any]) -> None:
    rows = [
        (
            c.get("id"),
            c.get("name"),
            c.get("state"),
            short(c.get("digest")),
            len(c.get("sources") or []),
            (c.get("spec") or {}).get("method"),
            (c.get("spec") or {}).get("rank"),
            (c.get("metrics") or {}).get("max_relative_error"),
            _rejection_code(c.get("rejection")),
        )
        for c in page.get("items", [])
    ]
    _table(
        "collections",
        ["id", "name", "state", "digest", "members", "method", "rank", "max rel err",
         "rejection"],
        rows,
        empty="no collections",
    )
    _next_cursor(page)
