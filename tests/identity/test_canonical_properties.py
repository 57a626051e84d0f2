"""Property tests for canonical JSON, and the no-torch import contract."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from dataplane.identity import IdentityError, canonical_json, digest

JS_SAFE = 2**53 - 1
scalars = st.none() | st.booleans() | st.integers(-JS_SAFE, JS_SAFE) | st.text(max_size=8)
ascii_keys = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=6)
values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(ascii_keys, children,
                                                                      max_size=4),
    max_leaves=12,
)


def reversed_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: reversed_keys(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [reversed_keys(v) for v in value]
    return value


@settings(max_examples=150, deadline=None)
@given(values)
def test_key_order_is_irrelevant(value: Any) -> None:
    assert canonical_json(reversed_keys(value)) == canonical_json(value)
    assert digest(reversed_keys(value)) == digest(value)


@settings(max_examples=150, deadline=None)
@given(values)
def test_matches_sorted_compact_json_for_ascii_keys(value: Any) -> None:
    """Independent reference: for ASCII keys, RFC 8785 equals sorted, compact json.dumps."""
    reference = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert canonical_json(value) == reference.encode("utf-8")


@settings(max_examples=100, deadline=None)
@given(values, st.floats(allow_nan=True, allow_infinity=True), st.integers(0, 3))
def test_floats_are_refused_anywhere(value: Any, number: float, depth: int) -> None:
    nested: Any = number
    for level in range(depth):
        nested = [nested] if level % 2 else {"k": nested}
    for candidate in ({"v": value, "f": nested}, [value, nested], nested):
        try:
            canonical_json(candidate)
        except IdentityError as exc:
            assert exc.code == "float_not_allowed"
        else:
            raise AssertionError("a float was serialised")


def test_importing_identity_does_not_import_torch_or_numpy() -> None:
    code = (
        "import sys, dataplane.identity\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == ""
