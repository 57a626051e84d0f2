"""The one place the control plane calls `dataplane.artifacts` (PEFT parsing/validation).

Imported lazily so the API starts fast; everything here is torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controlplane.config import Settings
from controlplane.errors import BadRequest


@dataclass(frozen=True)
class ParsedBase:
    h_base: str
    architecture: str | None
    record: dict[str, Any]


@dataclass(frozen=True)
class Validated:
    digest: str
    method: str
    modules: list[Any]
    tensor_bytes: int
    record: dict[str, Any]


@dataclass(frozen=True)
class Rejected:
    code: str
    message: str
    detail: dict[str, Any]


def parse_base_record(record: dict[str, Any]) -> ParsedBase:
    """Check an ABI record by round-tripping it through `BaseModelABI`; 422 if invalid."""
    from dataplane.artifacts import ArtifactRejected, BaseModelABI

    try:
        abi = BaseModelABI.from_record(record)
    except (ArtifactRejected, KeyError, TypeError, ValueError) as exc:
        raise BadRequest(f"invalid base model ABI record: {exc}",
                         detail={"field": "abi"}) from exc
    normalized = abi.to_record()
    architecture = getattr(abi, "architecture", None) or normalized.get("architecture")
    return ParsedBase(h_base=str(abi.h_base), architecture=_opt_str(architecture),
                      record=normalized)


def validate_adapter_dir(directory: Path, base_record: dict[str, Any],
                         settings: Settings) -> Validated | Rejected:
    """Validate a local PEFT dir against a base; a typed outcome, never an exception
    for a bad artifact (only for programming/environment errors)."""
    from dataplane.artifacts import (
        ArtifactLimits,
        ArtifactRejected,
        BaseModelABI,
        validate_peft_dir,
    )

    limits = ArtifactLimits(max_rank=settings.max_rank,
                            max_file_bytes=settings.max_artifact_bytes)
    try:
        result = validate_peft_dir(directory, BaseModelABI.from_record(base_record), limits)
    except ArtifactRejected as exc:
        code = getattr(exc.code, "value", exc.code)
        return Rejected(code=str(code), message=str(getattr(exc, "message", exc)),
                        detail=_jsonable(getattr(exc, "detail", None) or {}))
    record = _jsonable(result.to_record())
    modules = record.get("modules")
    if not isinstance(modules, list):
        modules = _jsonable(list(getattr(result, "modules", []) or []))
    return Validated(digest=str(result.h_artifact), method=str(result.method),
                     modules=modules, tensor_bytes=int(result.total_bytes), record=record)


def _opt_str(value: object) -> str | None:
    return None if value is None else str(value)


def _jsonable(value: Any) -> Any:
    """Coerce to JSON-compatible values (enums -> value, tuples -> lists, Fractions -> str)."""
    import enum
    from fractions import Fraction

    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, enum.Enum):
        return _jsonable(value.value)
    if isinstance(value, Fraction):
        return f"{value.numerator}/{value.denominator}"
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if hasattr(value, "to_record"):
        return _jsonable(value.to_record())
    return str(value)
