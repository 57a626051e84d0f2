"""Read a PEFT adapter directory (`adapter_config.json` + `adapter_model.safetensors`)
from an `s3://bucket/prefix` or `file:///dir` URI.

Only the two required files are read. Pickle-based weight files anywhere at the top
level of the prefix (`*.bin`, `*.pt`, ...) refuse the whole import: we never read them,
and an adapter that ships them is ambiguous about which weights are meant.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from controlplane.config import Settings
from controlplane.errors import BadRequest, Forbidden, ForbiddenFile, MissingFile
from controlplane.storage.base import ObjectNotFound, StorageError
from controlplane.storage.factory import file_uri_path, split_s3_uri

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
FORBIDDEN_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")


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


@contextmanager
def import_prefix(uri: str, settings: Settings) -> Iterator[dict[str, Path]]:
    """Yield `{file name: local path}` for the adapter at `uri` (temp copies for s3)."""
    if uri.startswith("file://"):
        if not settings.allow_file_uri_import:
            raise Forbidden("file:// imports are disabled on this server",
                            detail={"setting": "ADAPTERPLANE_ALLOW_FILE_URI_IMPORT"})
        root = file_uri_path(uri)
        if not root.is_dir():
            raise MissingFile(f"not a directory: {root}", detail={"uri": uri})
        check_listing([p.name for p in root.iterdir() if p.is_file()], uri)
        yield {name: root / name for name in ADAPTER_FILES}
        return
    if uri.startswith("s3://"):
        with _import_s3(uri, settings) as files:
            yield files
        return
    raise BadRequest("uri must start with s3:// or file://", detail={"uri": uri})


@contextmanager
def _import_s3(uri: str, settings: Settings) -> Iterator[dict[str, Path]]:
    from boto3.exceptions import RetriesExceededError
    from botocore.exceptions import BotoCoreError, ClientError, ParamValidationError

    from controlplane.storage.s3_store import make_s3_client, translate_error

    bucket, prefix = split_s3_uri(uri)
    client = make_s3_client(settings)
    base = f"{prefix}/" if prefix else ""
    try:
        names: list[str] = []
        paginator = client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=bucket, Prefix=base, Delimiter="/"):
            names.extend(obj["Key"][len(base):] for obj in page.get("Contents", []))
    except ParamValidationError as exc:  # e.g. a bucket name S3 cannot have
        raise BadRequest(f"invalid s3 uri: {uri}", detail={"uri": uri}) from exc
    except (BotoCoreError, ClientError) as exc:
        error = translate_error(exc, f"list {uri}")
        if isinstance(error, ObjectNotFound):  # no such bucket: the caller named nothing
            raise MissingFile(f"no such bucket: {uri}",
                              detail={"uri": uri, "missing": list(ADAPTER_FILES)}) from exc
        raise error from exc
    check_listing(names, uri)
    with tempfile.TemporaryDirectory(prefix="adapterplane-import-") as tmp:
        out: dict[str, Path] = {}
        for name in ADAPTER_FILES:
            dest = Path(tmp) / name
            try:
                client.download_file(bucket, base + name, str(dest))
            except (BotoCoreError, ClientError, RetriesExceededError) as exc:
                raise translate_error(exc, f"get {uri}/{name}") from exc
            out[name] = dest
        yield out


__all__ = ["ADAPTER_FILES", "StorageError", "import_prefix"]
