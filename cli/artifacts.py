"""`adapterctl push` and `adapterctl artifacts list|show`.

A push uploads a local PEFT directory (multipart: `base` + the two adapter files) or
registers an object-store URI (`s3://bucket/prefix`, `file:///dir`) as JSON. The API
answers 202 with a `pending` artifact (200 with the existing one for the same bytes);
`--wait` then polls until the worker moves it to `validated` or `rejected`.
"""

from __future__ import annotations

import io
import os
import re
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import typer

from cli import output
from cli.client import ApiClient, segment
from cli.context import current
from cli.errors import CliError, ExitCode, usage_error
from cli.invoke import call_and_emit
from cli.pagination import ALL_OPTION, CURSOR_OPTION, LIMIT_OPTION, list_pages
from cli.progress import Progress

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
URI_SCHEMES = ("s3://", "file://")
TERMINAL_STATES = frozenset({"validated", "rejected"})
DEFAULT_WAIT_TIMEOUT_S = 300.0
_DIGEST = re.compile(r"^(sha256:)?[0-9a-f]{64}$")

app = typer.Typer(help="Inspect artifacts of a namespace.", no_args_is_help=True)


def resolve_base(client: ApiClient, base: str) -> str:
    """Return the `h_base` for `base`, which is an h_base already or a registered name."""
    if _DIGEST.match(base):
        return base
    page = client.paginate("/v1/bases", params={"limit": 200}, follow=True)
    for item in page["items"]:
        if item.get("name") == base:
            return str(item["h_base"])
    raise CliError("NOT_FOUND", f"no base model named {base!r} (and it is not an h_base)")


def push_directory(client: ApiClient, namespace: str, h_base: str, directory: Path,
                   progress: Progress | None = None) -> Any:
    """Upload `directory`'s adapter_config.json + adapter_model.safetensors (streamed,
    each with a bar on `progress`).

    Both files must be regular files in `directory` itself: a symlink is refused (it may
    point anywhere on this machine), and the files are opened without following one.
    """
    progress = progress or Progress.off()
    if not directory.is_dir():
        raise usage_error(f"{directory} is not a directory")
    linked = [name for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS)
              if (directory / name).is_symlink()]
    if linked:
        raise usage_error(f"{directory}: {', '.join(linked)} is a symlink; "
                          "push a directory holding the files themselves")
    check_adapter_listing(directory)
    with ExitStack() as stack:
        files = {
            name: (
                name,
                stack.enter_context(progress.reader(name, _open_no_follow(directory / name))),
                "application/octet-stream",
            )
            for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS)
        }
        return client.request(
            "POST",
            f"/v1/namespaces/{segment(namespace)}/artifacts",
            data={"base": h_base},
            files=files,
        )


def check_adapter_listing(directory: Path) -> None:
    """The server's refusal of a directory, raised before anything is sent.

    The same rule as a `file://` or `s3://` import (`controlplane.storage.importing`):
    pickle weights anywhere at the top level exit 5 `FORBIDDEN_FILE`, a missing adapter
    file exits 5 `MISSING_FILE`. A bad artifact is not a usage error, wherever it is read.
    """
    from controlplane.errors import AdapterplaneError
    from controlplane.storage.importing import check_listing

    names = [entry.name for entry in directory.iterdir()]  # as the server lists a prefix
    try:
        check_listing(names, directory.resolve().as_uri())
    except AdapterplaneError as exc:
        raise CliError(exc.code, f"{directory}: {exc.message}", status=exc.status_code,
                       detail=exc.detail) from exc


def _open_no_follow(path: Path) -> io.BufferedReader:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:  # ELOOP: replaced by a symlink since the check
        raise usage_error(f"cannot open {path}: {exc.strerror}") from exc
    return os.fdopen(fd, "rb")


def push_uri(client: ApiClient, namespace: str, h_base: str, uri: str) -> Any:
    """Ask the server to import the adapter stored at `uri` (s3:// or file://)."""
    return client.post(
        f"/v1/namespaces/{segment(namespace)}/artifacts", json={"base": h_base, "uri": uri}
    )


def push_source(client: ApiClient, namespace: str, h_base: str, source: str,
                progress: Progress | None = None) -> Any:
    """Push `source`: an object-store URI when it has a known scheme, else a local dir
    (its upload shown on `progress`)."""
    if source.startswith(URI_SCHEMES):
        return push_uri(client, namespace, h_base, source)
    if "://" in source:
        raise usage_error(f"unsupported URI scheme in {source!r} (use s3:// or file://)")
    return push_directory(client, namespace, h_base, Path(source), progress)


def get_artifact(client: ApiClient, namespace: str, ref: str) -> Any:
    return client.get(f"/v1/namespaces/{segment(namespace)}/artifacts/{segment(ref)}")


def wait_for_validation(
    client: ApiClient,
    namespace: str,
    artifact_id: str,
    *,
    timeout_s: float = DEFAULT_WAIT_TIMEOUT_S,
    poll_s: float = 0.25,
    on_state: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Poll the artifact until `validated` or `rejected`; return it.

    Raises `CliError(WAIT_TIMEOUT)` (exit 9) after `timeout_s`. `on_state` is called on
    every state change (for progress display). Polling backs off to at most 2 s.
    """
    deadline = time.monotonic() + timeout_s
    last_state: str | None = None
    delay = poll_s
    while True:
        artifact: dict[str, Any] = get_artifact(client, namespace, artifact_id)
        state = str(artifact.get("state"))
        if state != last_state and on_state is not None:
            on_state(state)
        last_state = state
        if state in TERMINAL_STATES:
            return artifact
        if time.monotonic() + delay > deadline:
            raise CliError(
                "WAIT_TIMEOUT", f"artifact {artifact_id} still {state} after {timeout_s:g}s"
            )
        time.sleep(delay)
        delay = min(delay * 1.5, 2.0)


def rejection_error(artifact: dict[str, Any]) -> CliError | None:
    """A CliError (exit 5) carrying the rejection code when `artifact` is rejected."""
    if artifact.get("state") != "rejected":
        return None
    rejection = artifact.get("rejection") or {}
    return CliError(
        str(rejection.get("code") or "ARTIFACT_REJECTED"),
        str(rejection.get("message") or "artifact rejected"),
        detail=rejection.get("detail"),
        exit_code=ExitCode.INVALID,
    )


def push_command(
    ctx: typer.Context,
    source: str = typer.Argument(
        ..., metavar="DIR|URI", help="Local PEFT directory, s3://bucket/prefix or file:///dir."
    ),
    namespace: str = typer.Option(..., "--namespace", "-n", help="Target namespace."),
    base: str = typer.Option(
        ..., "--base", "-b", help="h_base of the base model (or its registered name)."
    ),
    wait: bool = typer.Option(False, "--wait", help="Wait until validated or rejected."),
    timeout: float = typer.Option(
        DEFAULT_WAIT_TIMEOUT_S, "--timeout", help="Seconds to wait with --wait."
    ),
) -> None:
    """Push a PEFT LoRA adapter; with --wait, exit 5 with the rejection code if rejected."""
    cli = current(ctx)
    with cli.client() as client, Progress.of(cli) as progress:
        artifact = push_source(client, namespace, resolve_base(client, base), source, progress)
        if wait and artifact.get("state") not in TERMINAL_STATES:
            output.note(f"pushed artifact {artifact.get('id')}; waiting for validation")
            with progress.waiting(f"artifact {artifact.get('id')}") as show:

                def on_state(state: str) -> None:
                    output.note(f"  state: {state}")
                    show(state)

                artifact = wait_for_validation(
                    client, namespace, str(artifact["id"]), timeout_s=timeout,
                    on_state=on_state,
                )
    output.emit(cli, artifact, output.render_artifact)
    error = rejection_error(artifact) if wait else None
    if error is not None:
        raise error


@app.command("list")
def list_command(
    ctx: typer.Context,
    namespace: str = typer.Argument(..., metavar="NS"),
    state: str | None = typer.Option(None, "--state", help="pending|validating|validated|rejected"),
    limit: int | None = LIMIT_OPTION,
    cursor: str | None = CURSOR_OPTION,
    all_pages: bool = ALL_OPTION,
) -> None:
    """List a namespace's artifacts (newest first, keyset-paginated)."""
    list_pages(
        ctx,
        f"/v1/namespaces/{segment(namespace)}/artifacts",
        output.render_artifacts,
        filters={"state": state},
        limit=limit,
        cursor=cursor,
        all_pages=all_pages,
    )


@app.command("show")
def show_command(
    ctx: typer.Context,
    namespace: str = typer.Argument(..., metavar="NS"),
    ref: str = typer.Argument(..., metavar="REF", help="Artifact id or sha256:<H_artifact>."),
) -> None:
    """Show one artifact, including its rejection reason if any."""
    call_and_emit(ctx, output.render_artifact, lambda client: get_artifact(client, namespace, ref))


@app.command("delete")
def delete_command(
    ctx: typer.Context,
    namespace: str = typer.Argument(..., metavar="NS"),
    ref: str = typer.Argument(..., metavar="REF", help="Artifact id or sha256:<H_artifact>."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
) -> None:
    """Delete an artifact nothing references (never published, no collection's source);
    its blobs are freed by the next blob GC. Referenced: exit 4 ARTIFACT_REFERENCED."""
    if not yes and not typer.confirm(f"delete artifact {ref} of namespace {namespace}?"):
        raise CliError("ABORTED", "nothing deleted", exit_code=ExitCode.USAGE)
    call_and_emit(ctx, output.render_artifact, lambda client: client.delete(
        f"/v1/namespaces/{segment(namespace)}/artifacts/{segment(ref)}"))
