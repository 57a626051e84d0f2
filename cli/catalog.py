"""Catalog commands: `publish`, `retire`, `rollback`, `resolve`, `history`, `aliases`.

Each mutation appends exactly one generation to the alias (the server does the
compare-and-swap on `--expected-generation`; a mismatch is 409 GENERATION_CONFLICT,
exit 4). Aliases are written `NS/ALIAS`.
"""

from __future__ import annotations

from typing import Any

import typer

from cli import output
from cli.client import ApiClient, segment
from cli.context import current
from cli.errors import usage_error


def parse_alias_ref(ref: str) -> tuple[str, str]:
    """Split `NS/ALIAS` into (namespace, alias); both must be non-empty."""
    namespace, sep, alias = ref.partition("/")
    if not sep or not namespace or not alias or "/" in alias:
        raise usage_error(f"expected NS/ALIAS, got {ref!r}")
    return namespace, alias


def _idempotency(key: str | None) -> dict[str, str] | None:
    return {"Idempotency-Key": key} if key else None


def _alias_path(namespace: str, alias: str) -> str:
    return f"/v1/namespaces/{segment(namespace)}/aliases/{segment(alias)}"


def publish(
    client: ApiClient,
    namespace: str,
    alias: str,
    artifact: str,
    *,
    expected_generation: int | None = None,
    reason: str | None = None,
    idempotency_key: str | None = None,
) -> Any:
    """Point `namespace/alias` at `artifact` (id or sha256:<H_artifact>); returns the generation."""
    body = {"artifact": artifact, "expected_generation": expected_generation, "reason": reason}
    return client.post(
        f"{_alias_path(namespace, alias)}/publish", json=body, headers=_idempotency(idempotency_key)
    )


def retire(
    client: ApiClient,
    namespace: str,
    alias: str,
    *,
    expected_generation: int | None = None,
    reason: str | None = None,
    idempotency_key: str | None = None,
) -> Any:
    body = {"expected_generation": expected_generation, "reason": reason}
    return client.post(
        f"{_alias_path(namespace, alias)}/retire", json=body, headers=_idempotency(idempotency_key)
    )


def rollback(
    client: ApiClient,
    namespace: str,
    alias: str,
    *,
    to_generation: int | None = None,
    expected_generation: int | None = None,
    reason: str | None = None,
    idempotency_key: str | None = None,
) -> Any:
    body = {
        "to_generation": to_generation,
        "expected_generation": expected_generation,
        "reason": reason,
    }
    return client.post(
        f"{_alias_path(namespace, alias)}/rollback",
        json=body,
        headers=_idempotency(idempotency_key),
    )


def resolve(client: ApiClient, namespace: str, alias: str) -> Any:
    return client.get(_alias_path(namespace, alias))


def history(
    client: ApiClient,
    namespace: str,
    alias: str,
    *,
    limit: int | None = None,
    cursor: str | None = None,
    follow: bool = False,
) -> dict[str, Any]:
    return client.paginate(
        f"{_alias_path(namespace, alias)}/history",
        params={"limit": limit, "cursor": cursor},
        follow=follow,
    )


_ALIAS_ARG = typer.Argument(..., metavar="NS/ALIAS")
_EXPECTED = typer.Option(
    None, "--expected-generation", help="Fail with exit 4 unless the alias is at this generation."
)
_REASON = typer.Option(None, "--reason", help="Recorded in history and audit.")
_IDEMPOTENCY = typer.Option(
    None,
    "--idempotency-key",
    help="Retry-safe: the same key and request return the original generation.",
)


def register(app: typer.Typer) -> None:
    """Add the catalog commands to the root app."""

    @app.command("publish")
    def publish_command(
        ctx: typer.Context,
        ref: str = _ALIAS_ARG,
        artifact: str = typer.Argument(
            ..., metavar="ARTIFACT", help="Artifact id or sha256:<H_artifact>."
        ),
        expected_generation: int | None = _EXPECTED,
        reason: str | None = _REASON,
        idempotency_key: str | None = _IDEMPOTENCY,
    ) -> None:
        """Publish ARTIFACT (validated, same namespace) under NS/ALIAS."""
        cli = current(ctx)
        namespace, alias = parse_alias_ref(ref)
        with cli.client() as client:
            gen = publish(
                client,
                namespace,
                alias,
                artifact,
                expected_generation=expected_generation,
                reason=reason,
                idempotency_key=idempotency_key,
            )
        output.emit(cli, gen, output.render_generation)

    @app.command("retire")
    def retire_command(
        ctx: typer.Context,
        ref: str = _ALIAS_ARG,
        expected_generation: int | None = _EXPECTED,
        reason: str | None = _REASON,
        idempotency_key: str | None = _IDEMPOTENCY,
    ) -> None:
        """Retire NS/ALIAS: resolving it answers 410 ALIAS_RETIRED (exit 8) afterwards."""
        cli = current(ctx)
        namespace, alias = parse_alias_ref(ref)
        with cli.client() as client:
            gen = retire(
                client,
                namespace,
                alias,
                expected_generation=expected_generation,
                reason=reason,
                idempotency_key=idempotency_key,
            )
        output.emit(cli, gen, output.render_generation)

    @app.command("rollback")
    def rollback_command(
        ctx: typer.Context,
        ref: str = _ALIAS_ARG,
        to_generation: int | None = typer.Option(
            None,
            "--to-generation",
            help="Generation whose artifact to restore (default: the newest earlier "
            "generation with a different artifact).",
        ),
        expected_generation: int | None = _EXPECTED,
        reason: str | None = _REASON,
        idempotency_key: str | None = _IDEMPOTENCY,
    ) -> None:
        """Append a rollback generation pointing at an older artifact (history is kept)."""
        cli = current(ctx)
        namespace, alias = parse_alias_ref(ref)
        with cli.client() as client:
            gen = rollback(
                client,
                namespace,
                alias,
                to_generation=to_generation,
                expected_generation=expected_generation,
                reason=reason,
                idempotency_key=idempotency_key,
            )
        output.emit(cli, gen, output.render_generation)

    @app.command("resolve")
    def resolve_command(ctx: typer.Context, ref: str = _ALIAS_ARG) -> None:
        """Show what NS/ALIAS means now (exit 8 if retired, 3 if never published)."""
        cli = current(ctx)
        namespace, alias = parse_alias_ref(ref)
        with cli.client() as client:
            resolution = resolve(client, namespace, alias)
        output.emit(cli, resolution, output.render_generation)

    @app.command("history")
    def history_command(
        ctx: typer.Context,
        ref: str = _ALIAS_ARG,
        limit: int | None = typer.Option(None, "--limit", min=1),
        cursor: str | None = typer.Option(None, "--cursor"),
        all_pages: bool = typer.Option(False, "--all", help="Follow next_cursor to the end."),
    ) -> None:
        """List NS/ALIAS's generations, newest first."""
        cli = current(ctx)
        namespace, alias = parse_alias_ref(ref)
        with cli.client() as client:
            page = history(client, namespace, alias, limit=limit, cursor=cursor, follow=all_pages)
        output.emit(cli, page, output.render_history)

    @app.command("aliases")
    def aliases_command(
        ctx: typer.Context,
        namespace: str = typer.Argument(..., metavar="NS"),
        limit: int | None = typer.Option(None, "--limit", min=1),
        cursor: str | None = typer.Option(None, "--cursor"),
        all_pages: bool = typer.Option(False, "--all", help="Follow next_cursor to the end."),
    ) -> None:
        """List the aliases of NS with their current generation."""
        cli = current(ctx)
        with cli.client() as client:
            page = client.paginate(
                f"/v1/namespaces/{segment(namespace)}/aliases",
                params={"limit": limit, "cursor": cursor},
                follow=all_pages,
            )
        output.emit(cli, page, output.render_aliases)
