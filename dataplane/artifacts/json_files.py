"""Reading small JSON config files strictly, and giving them float-free canonical digests."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path
from typing import Any

from dataplane.artifacts.errors import ArtifactRejected, RejectionCode
from dataplane.identity import JSONValue, digest

MAX_CONFIG_BYTES = 1 << 20


def read_json_object(path: Path, *, what: str) -> dict[str, Any]:
    """Load `path` as a JSON object; JSON numbers with a fraction part become Fractions.

    Raises MISSING_FILE, FILE_TOO_LARGE (over 1 MiB) or MALFORMED_CONFIG.
    """
    if not path.is_file():
        raise ArtifactRejected(RejectionCode.MISSING_FILE, f"{what} {path.name} is missing",
                               {"file": path.name})
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise ArtifactRejected(RejectionCode.FILE_TOO_LARGE, f"{path.name} exceeds 1 MiB",
                               {"file": path.name, "limit": MAX_CONFIG_BYTES})
    try:
        value = json.loads(path.read_bytes().decode("utf-8"), parse_float=Fraction,
                           parse_constant=_refuse_constant)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ArtifactRejected(RejectionCode.MALFORMED_CONFIG,
                               f"{path.name} is not valid JSON ({exc})",
                               {"file": path.name}) from exc
    if not isinstance(value, dict):
        raise ArtifactRejected(RejectionCode.MALFORMED_CONFIG,
                               f"{path.name} is not a JSON object", {"file": path.name})
    return value


def _refuse_constant(name: str) -> object:
    raise ValueError(f"non-standard JSON constant {name}")


JS_SAFE_INT = 2**53 - 1


def decimal_text(value: Fraction) -> str:
    """Exact normalised decimal of a terminating fraction: "<integer>e<exponent>".

    1e-5, 0.00001 and 10E-6 all give "1e-5"; 2.50 gives "25e-1". Raises ValueError for a
    non-terminating fraction (JSON decimals always terminate).
    """
    den, twos, fives = value.denominator, 0, 0
    while den % 2 == 0:
        den, twos = den // 2, twos + 1
    while den % 5 == 0:
        den, fives = den // 5, fives + 1
    if den != 1:
        raise ValueError(f"{value} has no finite decimal expansion")
    exponent = -max(twos, fives)
    mantissa = int(value * Fraction(10) ** -exponent)
    while mantissa and mantissa % 10 == 0:
        mantissa, exponent = mantissa // 10, exponent + 1
    return f"{mantissa}e{exponent if mantissa else 0}"


def exact_json(value: Any) -> JSONValue:
    """Make a parsed config hashable without floats.

    Decimal numbers (parsed as Fractions) become {"decimal": decimal_text(x)}; integers
    beyond ±(2^53-1) become {"integer": str(n)}; everything else is unchanged.
    """
    if isinstance(value, float):
        value = Fraction(repr(value))
    if isinstance(value, Fraction):
        return {"decimal": decimal_text(value)}
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > JS_SAFE_INT:
        return {"integer": str(value)}
    if isinstance(value, dict):
        return {str(k): exact_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [exact_json(v) for v in value]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    raise TypeError(f"not JSON: {type(value).__name__}")


def exact_digest(value: Any) -> str:
    return digest(exact_json(value))
