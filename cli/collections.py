"""`adapterctl collections fit|list|show|member|download`: Compress-then-Serve collections.

`fit` submits an ordered set of validated artifacts (ids or `sha256:<H_artifact>`) to be
fitted with shared bases; the fit runs on a worker, `--wait` polls until `fitted` or
`rejected` (exit 5 with the rejection code). `member` pushes one fitted member as an
ordinary rank-R artifact, validated and published like any adapter. `download` writes a
fitted collection's bundle files to a directory, each checked against its SHA-256
(`dataplane.collections.read_bundle` then loads and re-verifies it).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import httpx
import typer

from cli import output
from cli.artifacts import resolve_base, wait_for_validation
from cli.client import ApiClient, segment
from cli.context import current
from cli.errors import CliError, ExitCode
from cli.invoke import call_and_emit
from cli.pagination import ALL_OPTION, CURSOR_OPTION, LIMIT_OPTION, list_pages
from cli.progress import Advance, Progress

TERMINAL_STATES = frozenset({"fitted", "rejected"})
DEFAULT_WAIT_TIMEOUT_S = 1800.0

app = typer.Typer(help="Fit and inspect Compress-then-Serve collections.",
                  no_args_is_help=True)


def _root(namespace: str) -> str:
    return f"/v1/namespaces/{segment(namespace)}/collections"


def wait_for_fit(client: ApiClient, namespace: str, ref: str, *, timeout_s: float,
                 on_state: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Poll until `fitted` or `rejected` (CliError WAIT_TIMEOUT, exit 9, after timeout_s);
    every new state is noted on stderr and passed to `on_state`."""
    deadline = time.monotonic() + timeout_s
    delay, last = 0.25, None
    while True:
        collection: dict[str, Any] = client.get(f"{_root(namespace)}/{segment(ref)}")
        state = str(collection.get("state"))
        if state != last:
            output.note(f"  state: {state}")
            if on_state is not None:
                on_state(state)
        last = state
        if state in TERMINAL_STATES:
            return collection
        if time.monotonic() + delay > deadline:
            raise CliError("WAIT_TIMEOUT", f"collection {ref} still {state} after {timeout_s:g}s")
        time.sleep(delay)
        delay = min(delay * 1.5, 2.0)


@app.command("fit")
def fit_command(
    ctx: typer.Context,
    namespace: str = typer.Argument(..., metavar="NS"),
    sources: list[str] = typer.Option(..., "--source", "-s",
                                      help="Member artifact (id or sha256:<H_artifact>); "
                                           "repeat, in member order."),
    base: str = typer.Option(..., "--base", "-b", help="h_base (or registered name)."),
    name: str = typer.Option(..., "--name", help="A label for the collection."),
    rank: int = typer.Option(..., "--rank", help="Shared rank R."),
    method: str = typer.Option("jd-full", "--method", help="jd-full | jd-diag"),
    clusters: int = typer.Option(1, "--clusters"),
    iterations: int = typer.Option(10, "--iterations"),
    rounds: int = typer.Option(10, "--rounds"),
    seed: int = typer.Option(0, "--seed"),
    max_relative_error: str = typer.Option("1/10", "--max-relative-error",
                                           help="Release threshold, e.g. 1/20 or 0.05."),
    wait: bool = typer.Option(False, "--wait", help="Wait until fitted or rejected."),
    timeout: float = typer.Option(DEFAULT_WAIT_TIMEOUT_S, "--timeout"),
) -> None:
    """Submit a collection fit; with --wait, exit 5 with the rejection code if rejected."""
    cli = current(ctx)
    with cli.client() as client, Progress.of(cli) as progress:
        body = {"name": name, "base": resolve_base(client, base), "sources": sources,
                "method": method, "rank": rank, "clusters": clusters,
                "iterations": iterations, "rounds": rounds, "seed": seed,
                "max_relative_error": max_relative_error}
        collection: dict[str, Any] = client.post(_root(namespace), json=body)
        if wait and collection.get("state") not in TERMINAL_STATES:
            output.note(f"submitted collection {collection.get('id')}; waiting for the fit")
            with progress.waiting(f"collection {collection.get('id')}") as show:
                collection = wait_for_fit(client, namespace, str(collection["id"]),
                                          timeout_s=timeout, on_state=show)
    output.emit(cli, collection, output.render_collection)
    if wait and collection.get("state") == "rejected":
        rejection = collection.get("rejection") or {}
        raise CliError(str(rejection.get("code") or "COLLECTION_REJECTED"),
                       str(rejection.get("message") or "collection rejected"),
                       detail=rejection.get("detail"), exit_code=ExitCode.INVALID)


@app.command("list")
def list_command(
    ctx: typer.Context,
    namespace: str = typer.Argument(..., metavar="NS"),
    state: str | None = typer.Option(None, "--state", help="pending|fitting|fitted|rejected"),
    limit: int | None = LIMIT_OPTION,
    cursor: str | None = CURSOR_OPTION,
    all_pages: bool = ALL_OPTION,
) -> None:
    """List a namespace's collections (newest first)."""
    list_pages(ctx, _root(namespace), output.render_collections, filters={"state": state},
               limit=limit, cursor=cursor, all_pages=all_pages)


@app.command("show")
def show_command(
    ctx: typer.Context,
    namespace: str = typer.Argument(..., metavar="NS"),
    ref: str = typer.Argument(..., metavar="REF", help="Collection id or sha256:<H_collection>."),
) -> None:
    """Show one collection with its spec, assignment and reconstruction metrics."""
    call_and_emit(ctx, output.render_collection,
                  lambda client: client.get(f"{_root(namespace)}/{segment(ref)}"))


@app.command("member")
def member_command(
    ctx: typer.Context,
    namespace: str = typer.Argument(..., metavar="NS"),
    ref: str = typer.Argument(..., metavar="REF"),
    index: int = typer.Argument(..., metavar="INDEX", help="Member position (from 0)."),
    dtype: str = typer.Option("float32", "--dtype", help="float32 | float16 | bfloat16"),
    wait: bool = typer.Option(False, "--wait", help="Wait until the artifact is validated."),
) -> None:
    """Push member INDEX as a rank-R artifact (then publish it to an alias to serve it)."""
    cli = current(ctx)
    with cli.client() as client:
        artifact: dict[str, Any] = client.request(
            "POST", f"{_root(namespace)}/{segment(ref)}/members/{index}/artifact",
            params={"dtype": dtype})
        if wait and artifact.get("state") not in ("validated", "rejected"):
            artifact = wait_for_validation(client, namespace, str(artifact["id"]))
    output.emit(cli, artifact, output.render_artifact)


@app.command("download")
def download_command(
    ctx: typer.Context,
    namespace: str = typer.Argument(..., metavar="NS"),
    ref: str = typer.Argument(..., metavar="REF"),
    dest: Path = typer.Argument(..., metavar="DIR", help="Created if missing."),
) -> None:
    """Write a fitted collection's bundle (collection.json, collection.safetensors) to DIR;
    exit 5 (CHECKSUM_MISMATCH) if a file's bytes do not match its SHA-256."""
    cli = current(ctx)
    with cli.client() as client:
        bundle: dict[str, Any] = client.get(f"{_root(namespace)}/{segment(ref)}/bundle")
    dest.mkdir(parents=True, exist_ok=True)
    with Progress.of(cli) as progress:
        for name, meta in sorted(bundle["files"].items()):
            if "/" in name or name.startswith("."):
                raise CliError("INVALID_BUNDLE", f"unexpected file name {name!r} in the bundle")
            advance = progress.transfer(f"download {name}", _size(meta))
            _fetch(str(meta["url"]), dest / name, str(meta["sha256"]), name, advance)
    output.emit(cli, {"digest": bundle["digest"], "dir": str(dest),
                      "files": sorted(bundle["files"])},
                lambda doc: output.note(f"collection {doc['digest']} -> {doc['dir']}"))


def _chunks(url: str) -> Iterator[bytes]:
    """The bytes at `url` (file:// or http(s)) in 1 MiB chunks."""
    if url.startswith("file://"):
        with Path(unquote(urlparse(url).path)).open("rb") as src:
            while chunk := src.read(1 << 20):
                yield chunk
        return
    with httpx.stream("GET", url, timeout=60.0) as response:
        response.raise_for_status()
        yield from response.iter_bytes(1 << 20)


def _size(meta: dict[str, Any]) -> int | None:
    size = meta.get("size")
    return size if isinstance(size, int) else None


def _fetch(url: str, path: Path, sha256: str, name: str, advance: Advance) -> None:
    """Stream `url` to `path` through a temporary file, digest-checked; `advance` is told
    of every chunk written."""
    digest = hashlib.sha256()
    partial = path.with_name(f".{path.name}.partial")
    with partial.open("wb") as out:
        for chunk in _chunks(url):
            digest.update(chunk)
            out.write(chunk)
            advance(len(chunk))
    if digest.hexdigest() != sha256:
        partial.unlink()
        raise CliError("CHECKSUM_MISMATCH", f"{name}: downloaded bytes do not match "
                       "their SHA-256", detail={"expected": sha256,
                                                "actual": digest.hexdigest()},
                       exit_code=ExitCode.INVALID)
    partial.replace(path)
