"""Read a source base checkpoint (HF layout) from `s3://bucket/prefix` or `file:///dir`.

The control plane keeps only a base's ABI record, never its weights, so a merge request
names where the worker finds the checkpoint. What is read there is trusted only after its
ABI re-derives the registered H_base (`job.py`): the location is provenance, not identity.

Files read: `config.json`, `model.safetensors` or `model.safetensors.index.json` with its
shards, and the tokenizer files the checkpoint has (`TOKENIZER_FILES`; a release carries
them so an agent serving it reads text), top level only. A pickle weight file refuses the
whole source, as for adapter imports; `file://` follows the adapter import rules
(`allowed_import_directory`).
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from controlplane.config import Settings
from controlplane.errors import BadRequest
from controlplane.storage import StorageError
from controlplane.storage.base import ObjectNotFound
from controlplane.storage.factory import split_s3_uri
from controlplane.storage.importing import FORBIDDEN_SUFFIXES, allowed_import_directory

CONFIG_FILE = "config.json"
WEIGHTS_SUFFIX = ".safetensors"
INDEX_FILE = "model.safetensors.index.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json",
                   "chat_template.jinja", "generation_config.json")
"""Copied into a release as they are when the source has them (not part of H_base)."""


class CheckpointUnavailable(Exception):
    """The source names no usable checkpoint (missing files, pickle weights, not allowed):
    the merge is rejected, not retried."""

    def __init__(self, message: str, **detail: object) -> None:
        super().__init__(message)
        self.message = message
        self.detail = dict(detail)


def check_base_uri(uri: str, settings: Settings) -> None:
    """At submission: the scheme, and for file:// the import rules (nothing is read)."""
    if uri.startswith("file://"):
        allowed_import_directory(uri, settings)
        return
    if uri.startswith("s3://"):
        try:
            split_s3_uri(uri)
        except StorageError as exc:
            raise BadRequest(f"invalid s3 uri: {uri}", detail={"base_uri": uri}) from exc
        return
    raise BadRequest("base_uri must start with s3:// or file://", detail={"base_uri": uri})


def _wanted(names: list[str], uri: str) -> list[str]:
    forbidden = sorted(n for n in names if n.lower().endswith(FORBIDDEN_SUFFIXES))
    if forbidden:
        raise CheckpointUnavailable("the base checkpoint ships pickle weight files",
                                    uri=uri, files=forbidden)
    if CONFIG_FILE not in names:
        raise CheckpointUnavailable("the base checkpoint has no config.json", uri=uri)
    weights = sorted(n for n in names if n.endswith(WEIGHTS_SUFFIX))
    if not weights:
        raise CheckpointUnavailable("the base checkpoint has no .safetensors weights", uri=uri)
    extra = [INDEX_FILE] if INDEX_FILE in names else []
    return [CONFIG_FILE, *extra, *weights, *(n for n in TOKENIZER_FILES if n in names)]


def fetch_checkpoint(uri: str, settings: Settings, dest: Path) -> None:
    """Copy the checkpoint at `uri` into `dest`. CheckpointUnavailable: a refusal;
    StorageError: transient or unexpected (the job records it and retries)."""
    dest.mkdir(parents=True, exist_ok=True)
    if uri.startswith("file://"):
        _fetch_file(uri, settings, dest)
    elif uri.startswith("s3://"):
        _fetch_s3(uri, settings, dest)
    else:
        raise CheckpointUnavailable("base_uri must start with s3:// or file://", uri=uri)


def _fetch_file(uri: str, settings: Settings, dest: Path) -> None:
    from controlplane.errors import AdapterplaneError

    try:
        real = allowed_import_directory(uri, settings)
    except AdapterplaneError as exc:
        raise CheckpointUnavailable(exc.message, uri=uri, code=exc.code) from exc
    nofollow = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    dir_fd = os.open(real, nofollow | os.O_DIRECTORY)
    try:
        for name in _wanted(os.listdir(dir_fd), uri):
            try:
                fd = os.open(name, nofollow, dir_fd=dir_fd)  # ELOOP on a symlink
            except OSError as exc:
                raise CheckpointUnavailable(f"{name} cannot be read", uri=uri) from exc
            with os.fdopen(fd, "rb") as src:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise CheckpointUnavailable(f"{name} is not a regular file", uri=uri)
                with (dest / name).open("wb") as out:
                    shutil.copyfileobj(src, out, 1 << 20)
    finally:
        os.close(dir_fd)


def _fetch_s3(uri: str, settings: Settings, dest: Path) -> None:
    from botocore.exceptions import BotoCoreError, ClientError

    from controlplane.storage.s3_store import make_s3_client, translate_error

    bucket, prefix = split_s3_uri(uri)
    base = f"{prefix}/" if prefix else ""
    client = make_s3_client(settings)
    try:
        names: list[str] = []
        for page in client.get_paginator("list_objects_v2").paginate(
                Bucket=bucket, Prefix=base, Delimiter="/"):
            names.extend(obj["Key"][len(base):] for obj in page.get("Contents", []))
        for name in _wanted(names, uri):
            client.download_file(bucket, base + name, str(dest / name))
    except (BotoCoreError, ClientError) as exc:
        error = translate_error(exc, f"read {uri}")
        if isinstance(error, ObjectNotFound):
            raise CheckpointUnavailable(f"no base checkpoint at {uri}", uri=uri) from exc
        raise error from exc
