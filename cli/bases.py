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
from cli.errors import CliError, ExitCode, usage_error
from cli.invoke import call_and_emit
from cli.pagination import ALL_OPTION, CURSOR_OPTION, LIMIT_OPTION, list_pages

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
    call_and_emit(ctx, output.render_base, lambda client: register_base(client, name, model_dir))


@app.command("list")
def list_command(
    ctx: typer.Context,
    limit: int | None = LIMIT_OPTION,
    cursor: str | None = CURSOR_OPTION,
    all_pages: bool = ALL_OPTION,
) -> None:
    """List registered base models."""
    list_pages(
        ctx, "/v1/bases", output.render_bases, limit=limit, cursor=cursor, all_pages=all_pages
    )


def render_base_with_lineage(base: dict[str, Any]) -> None:
    output.render_base(base)
    from cli.merges import render_lineage

    render_lineage(list(base.get("lineage") or []))


def base_with_lineage(client: ApiClient, h_base: str) -> dict[str, Any]:
    """The base plus `lineage`: the merged releases that produced it (source base and
    ordered adapters; empty for a base registered from a checkpoint)."""
    base: dict[str, Any] = client.get(f"/v1/bases/{segment(h_base)}")
    lineage = client.get(f"/v1/bases/{segment(h_base)}/lineage")
    return {**base, "lineage": lineage["merges"]}


@app.command("show")
def show_command(ctx: typer.Context, h_base: str = typer.Argument(..., metavar="H_BASE")) -> None:
    """Show one base model; a merged base also shows its source base and adapters."""
    call_and_emit(ctx, render_base_with_lineage,
                  lambda client: base_with_lineage(client, h_base))
