"""Read a PEFT adapter directory (`adapter_config.json` + `adapter_model.safetensors`)
from an `s3://bucket/prefix` or `file:///dir` URI, as open binary streams.

Only the two required files are read. Pickle-based weight files anywhere at the top
level of the prefix (`*.bin`, `*.pt`, ...) refuse the whole import: we never read them,
and an adapter that ships them is ambiguous about which weights are meant.

Size: the files' sizes are checked against `max_artifact_bytes` before a byte is read
(the listing's sizes, then each object's `Content-Length`), and the bytes are counted
while they download, so an oversized import never fills the disk (413
ARTIFACT_TOO_LARGE; the temporary directory is removed on every exit).

`file://` reads the API server's own disk, so it is off unless `allow_file_uri_import`,
and then only for a directory inside one of `file_import_roots`, reached without a
symlink, whose two files are regular files opened without following symlinks. A
missing directory, one outside the roots and a symlink all get the same answer
(IMPORT_SOURCE_UNAVAILABLE), which says nothing about what exists on the server.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import IO, Any

from controlplane.config import Settings
from controlplane.errors import (
    ArtifactTooLarge,
    BadRequest,
    Forbidden,
    ForbiddenFile,
    ImportSourceUnavailable,
    MissingFile,
)
from controlplane.storage.base import ObjectNotFound, StorageError
from controlplane.storage.factory import file_uri_path, split_s3_uri

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
FORBIDDEN_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
DOWNLOAD_CHUNK_BYTES = 1024 * 1024


def check_listing(names: list[str], uri: str) -> None:
    forbidden = sorted(n for n in names if n.lower().endswith(FORBIDDEN_SUFFIXES))
    if forbidden:
        raise ForbiddenFile(
            "pickle-format weight files are not accepted; ship adapter_model.safetensors only",
            detail={"uri": uri, "files": forbidden, "rejection_code": "pickle_weights"},
        )
    missing = [n for n in ADAPTER_FILES if n not in names]
    if missing:
        raise MissingFile(f"missing required file(s): {', '.join(missing)}",
                          detail={"uri": uri, "missing": missing})


def check_size(total: int, max_bytes: int, uri: str) -> None:
    if total > max_bytes:
        raise ArtifactTooLarge(f"artifact exceeds {max_bytes} bytes",
                               detail={"limit_bytes": max_bytes, "uri": uri})


@contextmanager
def import_prefix(uri: str, settings: Settings) -> Iterator[dict[str, IO[bytes]]]:
    """Yield `{file name: binary stream}` for the adapter at `uri` (temp copies for s3)."""
    if uri.startswith("file://"):
        with _import_file(uri, settings) as files:
            yield files
        return
    if uri.startswith("s3://"):
        with _import_s3(uri, settings) as files:
            yield files
        return
    raise BadRequest("uri must start with s3:// or file://", detail={"uri": uri})


def _unavailable(uri: str) -> ImportSourceUnavailable:
    return ImportSourceUnavailable("file:// import source not found or not allowed",
                                   detail={"uri": uri})


def _allowed_directory(uri: str, settings: Settings) -> str:
    """The real path of the directory `uri` names, if it may be imported."""
    try:
        path = file_uri_path(uri)
    except StorageError as exc:
        raise _unavailable(uri) from exc
    if not path.is_absolute():
        raise _unavailable(uri)
    given = os.path.normpath(path)
    try:
        if not stat.S_ISDIR(os.lstat(given).st_mode):  # a symlink is not a directory here
            raise _unavailable(uri)
        real = os.path.realpath(given, strict=True)
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        raise _unavailable(uri) from exc
    roots = [os.path.realpath(root) for root in settings.file_import_roots]
    if not any(os.path.commonpath([real, root]) == root for root in roots):
        raise _unavailable(uri)
    return real


def allowed_import_directory(uri: str, settings: Settings) -> str:
    """The real path of the `file://` directory `uri` names, under the rules of adapter
    imports (off unless `allow_file_uri_import`, inside `file_import_roots`, no symlink);
    FORBIDDEN or IMPORT_SOURCE_UNAVAILABLE otherwise. Merged releases read base
    checkpoints under the same rules."""
    if not settings.allow_file_uri_import:
        raise Forbidden("file:// imports are disabled on this server",
                        detail={"setting": "ADAPTERPLANE_ALLOW_FILE_URI_IMPORT"})
    return _allowed_directory(uri, settings)


@contextmanager
def _import_file(uri: str, settings: Settings) -> Iterator[dict[str, IO[bytes]]]:
    if not settings.allow_file_uri_import:
        raise Forbidden("file:// imports are disabled on this server",
                        detail={"setting": "ADAPTERPLANE_ALLOW_FILE_URI_IMPORT"})
    real = _allowed_directory(uri, settings)
    nofollow = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    with ExitStack() as stack:
        try:
            dir_fd = os.open(real, nofollow | os.O_DIRECTORY)
        except OSError as exc:
            raise _unavailable(uri) from exc
        stack.callback(os.close, dir_fd)
        check_listing(os.listdir(dir_fd), uri)
        files: dict[str, IO[bytes]] = {}
        total = 0
        for name in ADAPTER_FILES:
            try:
                fd = os.open(name, nofollow, dir_fd=dir_fd)  # ELOOP on a symlink
            except OSError as exc:
                raise _unavailable(uri) from exc
            handle = stack.enter_context(os.fdopen(fd, "rb"))
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise _unavailable(uri)
            total += info.st_size
            files[name] = handle
        check_size(total, settings.max_artifact_bytes, uri)
        yield files


@contextmanager
def _import_s3(uri: str, settings: Settings) -> Iterator[dict[str, IO[bytes]]]:
    from botocore.exceptions import BotoCoreError, ClientError, ParamValidationError

    from controlplane.storage.s3_store import make_s3_client, translate_error

    bucket, prefix = split_s3_uri(uri)
    client = make_s3_client(settings)
    base = f"{prefix}/" if prefix else ""
    try:
        sizes: dict[str, int] = {}
        paginator = client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=bucket, Prefix=base, Delimiter="/"):
            sizes.update({obj["Key"][len(base):]: int(obj.get("Size", 0))
                          for obj in page.get("Contents", [])})
    except ParamValidationError as exc:  # e.g. a bucket name S3 cannot have
        raise BadRequest(f"invalid s3 uri: {uri}", detail={"uri": uri}) from exc
    except (BotoCoreError, ClientError) as exc:
        error = translate_error(exc, f"list {uri}")
        if isinstance(error, ObjectNotFound):  # no such bucket: the caller named nothing
            raise MissingFile(f"no such bucket: {uri}",
                              detail={"uri": uri, "missing": list(ADAPTER_FILES)}) from exc
        raise error from exc
    check_listing(list(sizes), uri)
    limit = settings.max_artifact_bytes
    check_size(sum(sizes[name] for name in ADAPTER_FILES), limit, uri)
    with tempfile.TemporaryDirectory(prefix="adapterplane-import-") as tmp, \
            ExitStack() as stack:
        files: dict[str, IO[bytes]] = {}
        remaining = limit
        for name in ADAPTER_FILES:
            dest = Path(tmp) / name
            try:
                remaining -= _download(client, bucket, base + name, dest, remaining, uri)
            except (BotoCoreError, ClientError) as exc:
                raise translate_error(exc, f"get {uri}/{name}") from exc
            files[name] = stack.enter_context(dest.open("rb"))
        yield files


def _download(client: Any, bucket: str, key: str, dest: Path, budget: int, uri: str) -> int:
    """Write object `key` to `dest`, refusing it (ArtifactTooLarge) as soon as it is
    known or seen to exceed `budget` bytes; return its size."""
    response = client.get_object(Bucket=bucket, Key=key)
    body = response["Body"]
    try:
        check_size(int(response.get("ContentLength", 0)), budget, uri)
        written = 0
        with dest.open("wb") as out:
            for chunk in body.iter_chunks(DOWNLOAD_CHUNK_BYTES):
                written += len(chunk)
                check_size(written, budget, uri)
                out.write(chunk)
        return written
    finally:
        body.close()


__all__ = ["ADAPTER_FILES", "StorageError", "allowed_import_directory", "import_prefix"]
