"""Catalog commands: `publish`, `retire`, `rollback`, `resolve`, `history`, `aliases`,
`set-hot`.

Each mutation appends exactly one generation to the alias (the server does the
compare-and-swap on `--expected-generation`; a mismatch is 409 GENERATION_CONFLICT,
exit 4). `set-hot` appends none: it sets the alias's hot mark (prefetch on every
compatible agent). Aliases are written `NS/ALIAS`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, TypedDict, Unpack

import typer

from cli import output
from cli.client import ApiClient, segment
from cli.errors import usage_error
from cli.invoke import call_and_emit
from cli.pagination import ALL_OPTION, CURSOR_OPTION, LIMIT_OPTION, list_pages

Mutation = Literal["publish", "retire", "rollback"]


def parse_alias_ref(ref: str) -> tuple[str, str]:
    """Split `NS/ALIAS` into (namespace, alias); both must be non-empty."""
    namespace, sep, alias = ref.partition("/")
    if not sep or not namespace or not alias or "/" in alias:
        raise usage_error(f"expected NS/ALIAS, got {ref!r}")
    return namespace, alias


def _alias_path(namespace: str, alias: str) -> str:
    return f"/v1/namespaces/{segment(namespace)}/aliases/{segment(alias)}"


def _history_path(namespace: str, alias: str) -> str:
    return f"{_alias_path(namespace, alias)}/history"


class MutationGuards(TypedDict, total=False):
    """Keyword options every catalog mutation takes; an omitted one counts as None.

    `expected_generation`: the server's compare-and-swap (mismatch: 409, exit 4).
    `reason`: recorded in history and audit. `idempotency_key`: sent, when non-empty, as
    the `Idempotency-Key` header so a retry returns the original generation.
    """

    expected_generation: int | None
    reason: str | None
    idempotency_key: str | None


def mutate_alias(
    client: ApiClient,
    namespace: str,
    alias: str,
    action: Mutation,
    fields: Mapping[str, Any],
    **guards: Unpack[MutationGuards],
) -> Any:
    """POST `action` on `namespace/alias` with `fields` + guards; returns the new generation."""
    body = {
        **fields,
        "expected_generation": guards.get("expected_generation"),
        "reason": guards.get("reason"),
    }
    key = guards.get("idempotency_key")
    headers = {"Idempotency-Key": key} if key else None
    return client.post(f"{_alias_path(namespace, alias)}/{action}", json=body, headers=headers)


def publish(
    client: ApiClient,
    namespace: str,
    alias: str,
    artifact: str | None = None,
    *,
    release: str | None = None,
    **guards: Unpack[MutationGuards],
) -> Any:
    """Point `namespace/alias` at `artifact` (id or sha256:<H_artifact>) or at a merged
    `release` (merge id or sha256:<H_merged>); returns the generation."""
    fields = {"artifact": artifact} if release is None else {"release": release}
    return mutate_alias(client, namespace, alias, "publish", fields, **guards)


def retire(client: ApiClient, namespace: str, alias: str, **guards: Unpack[MutationGuards]) -> Any:
    """Retire `namespace/alias`; resolving it answers 410 ALIAS_RETIRED afterwards."""
    return mutate_alias(client, namespace, alias, "retire", {}, **guards)


def rollback(
    client: ApiClient,
    namespace: str,
    alias: str,
    *,
    to_generation: int | None = None,
    **guards: Unpack[MutationGuards],
) -> Any:
    """Restore `to_generation`'s target (default: the newest earlier different one)."""
    fields = {"to_generation": to_generation}
    return mutate_alias(client, namespace, alias, "rollback", fields, **guards)


def resolve(client: ApiClient, namespace: str, alias: str) -> Any:
    return client.get(_alias_path(namespace, alias))


def set_hot(client: ApiClient, namespace: str, alias: str, hot: bool) -> Any:
    """Set `namespace/alias`'s hot mark (admin on `*`); returns the alias's resolution."""
    return client.patch(_alias_path(namespace, alias), json={"hot": hot})


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
        _history_path(namespace, alias),
        params={"limit": limit, "cursor": cursor},
        follow=follow,
    )


def _emit_mutation(
    ctx: typer.Context,
    ref: str,
    action: Mutation,
    fields: Mapping[str, Any],
    expected_generation: int | None,
    reason: str | None,
    idempotency_key: str | None,
) -> None:
    """The body of the `publish`, `retire` and `rollback` commands."""
    namespace, alias = parse_alias_ref(ref)
    guards = MutationGuards(
        expected_generation=expected_generation, reason=reason, idempotency_key=idempotency_key
    )
    call_and_emit(
        ctx,
        output.render_generation,
        lambda client: mutate_alias(client, namespace, alias, action, fields, **guards),
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
        artifact: str | None = typer.Argument(
            None, metavar="[ARTIFACT]", help="Artifact id or sha256:<H_artifact>."
        ),
        release: str | None = typer.Option(
            None,
            "--release",
            metavar="MERGE",
            help="Serve a merged release instead (merge id or sha256:<H_merged>): agents of "
            "the release's base answer the alias with no adapter.",
        ),
        expected_generation: int | None = _EXPECTED,
        reason: str | None = _REASON,
        idempotency_key: str | None = _IDEMPOTENCY,
    ) -> None:
        """Publish ARTIFACT (validated, same namespace) or --release MERGE under NS/ALIAS."""
        if (artifact is None) == (release is None):
            raise usage_error("give an ARTIFACT or --release MERGE (exactly one)")
        fields = {"artifact": artifact} if release is None else {"release": release}
        _emit_mutation(ctx, ref, "publish", fields, expected_generation, reason, idempotency_key)

    @app.command("retire")
    def retire_command(
        ctx: typer.Context,
        ref: str = _ALIAS_ARG,
        expected_generation: int | None = _EXPECTED,
        reason: str | None = _REASON,
        idempotency_key: str | None = _IDEMPOTENCY,
    ) -> None:
        """Retire NS/ALIAS: resolving it answers 410 ALIAS_RETIRED (exit 8) afterwards."""
        _emit_mutation(ctx, ref, "retire", {}, expected_generation, reason, idempotency_key)

    @app.command("rollback")
    def rollback_command(
        ctx: typer.Context,
        ref: str = _ALIAS_ARG,
        to_generation: int | None = typer.Option(
            None,
            "--to-generation",
            help="Generation whose target (artifact or release) to restore (default: the "
            "newest earlier generation with a different target).",
        ),
        expected_generation: int | None = _EXPECTED,
        reason: str | None = _REASON,
        idempotency_key: str | None = _IDEMPOTENCY,
    ) -> None:
        """Append a rollback generation pointing at an older target (history is kept)."""
        fields = {"to_generation": to_generation}
        _emit_mutation(ctx, ref, "rollback", fields, expected_generation, reason, idempotency_key)

    @app.command("resolve")
    def resolve_command(ctx: typer.Context, ref: str = _ALIAS_ARG) -> None:
        """Show what NS/ALIAS means now (exit 8 if retired, 3 if never published)."""
        namespace, alias = parse_alias_ref(ref)
        call_and_emit(
            ctx, output.render_generation, lambda client: resolve(client, namespace, alias)
        )

    @app.command("set-hot")
    def set_hot_command(
        ctx: typer.Context,
        ref: str = _ALIAS_ARG,
        off: bool = typer.Option(False, "--off", help="Clear the mark instead."),
    ) -> None:
        """Mark NS/ALIAS hot: prefetch its current artifact on every agent (admin on `*`).

        Every compatible agent with room keeps the artifact resident, so a publication to
        the alias is loaded before any request arrives. Exit 3: unknown alias; 6: not admin.
        """
        namespace, alias = parse_alias_ref(ref)
        call_and_emit(
            ctx,
            output.render_generation,
            lambda client: set_hot(client, namespace, alias, not off),
        )

    @app.command("history")
    def history_command(
        ctx: typer.Context,
        ref: str = _ALIAS_ARG,
        limit: int | None = LIMIT_OPTION,
        cursor: str | None = CURSOR_OPTION,
        all_pages: bool = ALL_OPTION,
    ) -> None:
        """List NS/ALIAS's generations, newest first."""
        namespace, alias = parse_alias_ref(ref)
        list_pages(
            ctx,
            _history_path(namespace, alias),
            output.render_history,
            limit=limit,
            cursor=cursor,
            all_pages=all_pages,
        )

    @app.command("aliases")
    def aliases_command(
        ctx: typer.Context,
        namespace: str = typer.Argument(..., metavar="NS"),
        limit: int | None = LIMIT_OPTION,
        cursor: str | None = CURSOR_OPTION,
        all_pages: bool = ALL_OPTION,
    ) -> None:
        """List the aliases of NS with their current generation."""
        list_pages(
            ctx,
            f"/v1/namespaces/{segment(namespace)}/aliases",
            output.render_aliases,
            limit=limit,
            cursor=cursor,
            all_pages=all_pages,
        )
