"""Read an artifact's `adapter_config.json` back from object storage (for the diff).

The blob is fetched by its content address and checked against the SHA-256 recorded at
push, so the console never shows a config other than the one that was validated.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from controlplane.models import Artifact
from controlplane.storage import ObjectStore, StorageError

CONFIG_FILE = "adapter_config.json"


class ConfigUnavailable(Exception):
    """The config could not be read (storage failure, checksum mismatch, bad JSON)."""


def read_adapter_config(store: ObjectStore, artifact: Artifact) -> dict[str, Any]:
    ref = artifact.files.get(CONFIG_FILE)
    if not isinstance(ref, dict):
        raise ConfigUnavailable(f"artifact {artifact.id} has no {CONFIG_FILE}")
    with tempfile.TemporaryDirectory(prefix="console-config-") as tmp:
        dest = Path(tmp) / CONFIG_FILE
        try:
            store.get_blob(str(ref["key"]), dest, expected_sha256=str(ref["sha256"]))
            doc = json.loads(dest.read_text(encoding="utf-8"))
        except (StorageError, OSError, ValueError) as exc:
            raise ConfigUnavailable(f"artifact {artifact.id}: {CONFIG_FILE} could not be "
                                    f"read ({type(exc).__name__}: {exc})") from exc
    if not isinstance(doc, dict):
        raise ConfigUnavailable(f"artifact {artifact.id}: {CONFIG_FILE} is not an object")
    return doc
