"""`adapterctl bases register|list|show`.

`register` computes the base model's ABI (HF config + weight shapes and digests, read
without loading weights) locally with `dataplane.artifacts.read_base_abi`, so the
server never needs the base weights; it POSTs `{"name", "abi": abi.to_record()}`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from cli import output
from cli.client import ApiClient, segment
from cli.context import current
from cli.errors import CliError, ExitCode, usage_error

app = typer.Typer(help="Register and list base models.", no_args_is_help=True)


def base_abi_record(model_dir: Path) -> dict[str, Any]:
    """The ABI record of the HF checkpoint in `model_dir` (config.json + *.safetensors)."""
    if not model_dir.is_dir():
        raise usage_error(f"{model_dir} is not a directory")
    from dataplane.artifacts import read_base_abi
    from dataplane.artifacts.errors import ArtifactRejected

    try:
        abi = read_base_abi(model_dir)
    except ArtifactRejected as exc:
        raise CliError(
            exc.code.value,
            f"base model in {model_dir} refused: {exc.message}",
            detail=exc.detail,
            exit_code=ExitCode.INVALID,
        ) from exc
    except (OSError, ValueError) as exc:
        raise usage_error(f"cannot read base model in {model_dir}: {exc}") from exc
    record: dict[str, Any] = abi.to_record()
    return record


def register_base(client: ApiClient, name: str, model_dir: Path) -> Any:
    """Register the base model in `model_dir` under `name`; returns the base (201 or 200)."""
    return client.post("/v1/bases", json={"name": name, "abi": base_abi_record(model_dir)})


@app.command("register")
def register_command(
    ctx: typer.Context,
    model_dir: Path = typer.Argument(..., metavar="DIR", help="HF safetensors checkpoint."),
    name: str = typer.Option(..., "--name", help="Human name (not part of H_base)."),
) -> None:
    """Register a base model; registering the same weights again returns the existing one."""
    cli = current(ctx)
    with cli.client() as client:
        base = register_base(client, name, model_dir)
    output.emit(cli, base, output.render_base)


@app.command("list")
def list_command(
    ctx: typer.Context,
    limit: int | None = typer.Option(None, "--limit", min=1),
    cursor: str | None = typer.Option(None, "--cursor"),
    all_pages: bool = typer.Option(False, "--all", help="Follow next_cursor to the end."),
) -> None:
    """List registered base models."""
    cli = current(ctx)
    with cli.client() as client:
        page = client.paginate(
            "/v1/bases", params={"limit": limit, "cursor": cursor}, follow=all_pages
        )
    output.emit(cli, page, output.render_bases)


@app.command("show")
def show_command(ctx: typer.Context, h_base: str = typer.Argument(..., metavar="H_BASE")) -> None:
    """Show one base model."""
    cli = current(ctx)
    with cli.client() as client:
        base = client.get(f"/v1/bases/{segment(h_base)}")
    output.emit(cli, base, output.render_base)
