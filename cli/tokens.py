"""`adapterctl tokens create|revoke`: API tokens with per-namespace grants.

A grant is `NS:ROLE` with ROLE in read < publish < admin and NS `*` for every namespace.
The server stores only the token's hash; the plaintext is printed once.
"""

from __future__ import annotations

from typing import Any

import typer

from cli import output
from cli.client import ApiClient
from cli.errors import usage_error
from cli.invoke import call_and_emit

ROLES = ("read", "publish", "admin")

app = typer.Typer(help="Create and revoke API tokens.", no_args_is_help=True)


def parse_grant(text: str) -> dict[str, str]:
    """`NS:ROLE` -> `{"namespace": NS, "role": ROLE}`; the role must be known."""
    namespace, sep, role = text.rpartition(":")
    if not sep or not namespace or role not in ROLES:
        raise usage_error(f"grant must be NS:ROLE with ROLE in {'|'.join(ROLES)}, got {text!r}")
    return {"namespace": namespace, "role": role}


def create_token(client: ApiClient, name: str, grants: list[str], *, is_agent: bool) -> Any:
    body = {"name": name, "grants": [parse_grant(g) for g in grants], "is_agent": is_agent}
    return client.post("/v1/tokens", json=body)


@app.command("create")
def create_command(
    ctx: typer.Context,
    name: str = typer.Option(..., "--name"),
    grant: list[str] = typer.Option(
        [],
        "--grant",
        metavar="NS:ROLE",
        help="Repeatable, e.g. --grant acme:publish --grant '*:read'.",
    ),
    agent: bool = typer.Option(False, "--agent", help="Agent token (reads desired state)."),
) -> None:
    """Create a token (admin on `*`); the plaintext token is shown once."""
    if not grant and not agent:
        raise usage_error("give at least one --grant NS:ROLE (or --agent)")
    call_and_emit(
        ctx, output.render_token, lambda client: create_token(client, name, grant, is_agent=agent)
    )


@app.command("revoke")
def revoke_command(
    ctx: typer.Context, token_id: int = typer.Argument(..., metavar="ID", help="Token id.")
) -> None:
    """Revoke a token (admin on `*`); it stops authenticating at once."""
    call_and_emit(ctx, output.render_token, lambda client: client.delete(f"/v1/tokens/{token_id}"))
